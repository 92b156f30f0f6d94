"""Real DeepSpeed pipelines for the tests (gloo, CPU, one process per rank, tests/support/pipe_worker.py):
start them under a watchdog and compare their runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port

WORKER = Path(__file__).resolve().parent / "pipe_worker.py"
ROOT = Path(__file__).resolve().parents[2]
WATCHDOG_S = 150


def run_pipeline(stages: int, runs: list[dict], tmp_path: Path, world: int | None = None,
                 env_extra: dict[str, str] | None = None) -> list[dict]:
    """Start one process per rank (default: one per stage); kill them all if the watchdog expires."""
    world = world or stages
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world),
        "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",  # a rank killed by a signal prints its Python stack to its log
        **(env_extra or {}),
    }
    spec = json.dumps({"stages": stages, "runs": runs})
    # output to files, not pipes: a rank blocked writing to a full pipe nobody reads (the test waits on
    # rank 0 first) would hang the whole job until the watchdog
    logs = [tmp_path / f"rank{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        with logs[r].open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), spec, str(tmp_path)],
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    deadline = time.monotonic() + WATCHDOG_S
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        tails = "".join(f"--- rank {r} ---\n{log.read_text()[-1500:]}\n" for r, log in enumerate(logs))
        pytest.fail(f"pipeline with {stages} stages did not finish in {WATCHDOG_S}s (deadlock?)\n{tails}")
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r].read_text()[-3000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def orders_json(orders):
    """Unit orders as the worker's JSON spec takes them."""
    return [[list(u) for u in o] for o in orders]


def assert_same_math(results: list[dict], name: str, reference: str) -> None:
    """Losses and every rank's parameters of run `name` equal those of run `reference`."""
    for rank in results:
        assert rank[name]["losses"] == pytest.approx(rank[reference]["losses"], rel=1e-6, abs=1e-7), name
        for pname, values in rank[reference]["params"].items():
            assert rank[name]["params"][pname] == pytest.approx(values, rel=1e-5, abs=1e-6), (name, pname)

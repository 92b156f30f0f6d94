"""Real DeepSpeed pipelines (gloo, CPU, one process per stage): EnvPipe orders vs stock 1F1B."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from tests.support.ports import free_port

WORKER = Path(__file__).resolve().parents[1] / "support" / "pipe_worker.py"
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


def _orders(orders):
    return [[list(u) for u in o] for o in orders]


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 4])
def test_envpipe_schedule_matches_stock_1f1b_and_never_deadlocks(stages: int, tmp_path: Path) -> None:
    M, steps = 4, 3
    full = [M] * stages  # every non-last stage runs all its forwards first: the most in-flight sends
    runs = [
        {"name": "stock", "engine": "stock", "M": M, "steps": steps, "orders": None},
        {
            "name": "1f1b",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": _orders(one_f_one_b(stages, M)),
        },
        {
            "name": "envpipe",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": _orders(envpipe_schedule(stages, M, [1] * stages)),
        },
        {
            "name": "envpipe_full",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": _orders(envpipe_schedule(stages, M, full)),
        },
    ]
    for extra_m in (8, 16):
        runs.append(
            {
                "name": f"envpipe_full_M{extra_m}",
                "engine": "envpipe",
                "M": extra_m,
                "steps": 1,
                "orders": _orders(envpipe_schedule(stages, extra_m, [extra_m] * stages)),
            }
        )
        runs.append(
            {
                "name": f"envpipe_r1_M{extra_m}",
                "engine": "envpipe",
                "M": extra_m,
                "steps": 1,
                "orders": _orders(envpipe_schedule(stages, extra_m, [1] * stages)),
            }
        )
    results = run_pipeline(stages, runs, tmp_path)
    last = results[-1]
    assert last["stock"]["engine"] == "PipelineEngine" and last["envpipe"]["engine"] == "EnvPipeEngine"
    assert len(last["stock"]["losses"]) == steps
    assert last["stock"]["losses"][0] != last["stock"]["losses"][-1]  # it trains
    for name in ("1f1b", "envpipe", "envpipe_full"):
        assert last[name]["losses"] == pytest.approx(last["stock"]["losses"], rel=1e-6, abs=1e-7)
        for rank in results:  # every stage's parameters after the steps
            for pname, values in rank["stock"]["params"].items():
                assert rank[name]["params"][pname] == pytest.approx(values, rel=1e-5, abs=1e-6), (name, pname)
    for extra_m in (8, 16):
        for name in (f"envpipe_full_M{extra_m}", f"envpipe_r1_M{extra_m}"):
            assert len(last[name]["losses"]) == 1


@pytest.mark.slow
def test_two_data_parallel_pipelines(tmp_path: Path) -> None:
    """2 stages x 2 data-parallel replicas: the per-direction groups of both pipelines stay apart."""
    M, steps = 4, 2
    runs = [
        {"name": "stock", "engine": "stock", "M": M, "steps": steps, "orders": None},
        {
            "name": "envpipe",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": _orders(envpipe_schedule(2, M, [M, 0])),
        },
    ]
    results = run_pipeline(2, runs, tmp_path, world=4)
    for rank in results:
        for pname, values in rank["stock"]["params"].items():
            assert rank["envpipe"]["params"][pname] == pytest.approx(values, rel=1e-5, abs=1e-6), pname
        assert rank["envpipe"]["losses"] == pytest.approx(rank["stock"]["losses"], rel=1e-6, abs=1e-7)

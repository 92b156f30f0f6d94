"""The GPU benchmark scripts, run in their CPU mode (tiny model, gloo) so the lent-GPU run cannot fail on a
typo: benchmarks/runtime_h200.sh -> runtime_bench.py under torchrun -> runtime_results.py, and
benchmarks/engine_ablation.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envpipe.runtime.summary import RunSummary
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_runtime_benchmark_scripts_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "CPU": "1", "OUT": str(tmp_path), "PYTHON": sys.executable, "MODELS": "gpt2",
           "MS_gpt2": "2,4", "ROUNDS": "2", "STEPS": "2"}  # fmt: skip
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "runtime_h200.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    bench = json.loads((tmp_path / "gpt2" / "bench.json").read_text())
    assert bench["stages"] == 2 and [r["M"] for r in bench["runs"]] == [2, 4]
    for run in bench["runs"]:
        assert len(run["rounds"]) == 2 and len(run["throughput_ratio"]["per_round"]) == 2
        for r in run["rounds"]:
            assert RunSummary.from_json(r["stock"]).engine == "stock-deepspeed-1f1b"
            rt = RunSummary.from_json(r["runtime_1f1b"])
            assert rt.plan is not None and rt.plan.order == "1f1b" and rt.plan.policy == "baseline"
        optimal = RunSummary.from_json(run["runtime_optimal"])
        assert optimal.plan is not None and optimal.plan.policy == "optimal" and optimal.predicted is not None
        assert RunSummary.from_json(run["runtime_envpipe"]).prediction_error is not None
    md = (tmp_path / "runtime_h200.md").read_text()
    for heading in ("## Throughput: the runtime in 1F1B order", "## Predicted vs measured iteration time",
                    "## The plan of the runtime's default policy (optimal)"):  # fmt: skip
        assert heading in md
    assert "| gpt2 | 2 | 4 |" in md and "simulated** against its own 1F1B all-max baseline" in md
    assert "cpus:" in (tmp_path / "machine.txt").read_text()


@pytest.mark.slow
def test_engine_ablation_on_cpu(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(ROOT / "benchmarks" / "engine_ablation.py"), "--cpu", "--out", str(tmp_path), "--rounds", "2",
           "--steps", "2", "--torch-profile", "1"]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "ablation.json").read_text())
    (run,) = report["runs"]
    assert set(run["throughput_vs_stock"]) == {"stock", "engine", "engine+meter", "runtime"}
    assert run["throughput_vs_stock"]["stock"]["median"] == 1.0
    assert "| 8 | runtime |" in (tmp_path / "ablation.md").read_text()
    assert (tmp_path / "profile_M8_runtime_rank0_self_cpu_time_total.txt").stat().st_size > 0


def test_results_renderer_refuses_an_empty_directory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "runtime_results.py"), str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "no */bench.json" in proc.stderr

"""The GPU benchmark scripts, run in their CPU mode (tiny model, gloo) so the lent-GPU run cannot fail
on a typo: benchmarks/runtime_h200.sh -> runtime_bench.py under torchrun -> runtime_results.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_runtime_benchmark_scripts_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "CPU": "1", "OUT": str(tmp_path), "PYTHON": sys.executable, "STAGES": "2",
           "MS_2": "2,4", "ROUNDS": "2", "STEPS": "1"}  # fmt: skip
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "runtime_h200.sh")], env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failed" not in proc.stdout, (tmp_path / "pp2.log").read_text()[-4000:]
    bench = json.loads((tmp_path / "pp2" / "bench.json").read_text())
    assert bench["stages"] == 2 and [r["M"] for r in bench["runs"]] == [2, 4]
    for run in bench["runs"]:
        assert len(run["rounds"]) == 2 and len(run["throughput_ratio"]["per_round"]) == 2
        assert len(run["engine_ratio"]["per_round"]) == 2
        assert all(r["engine_1f1b"]["engine"].startswith("envpipe-engine-1f1b") for r in run["rounds"])
        assert all(r["stock"]["engine"] == "stock-deepspeed-1f1b" for r in run["rounds"])
        assert all(r["runtime_1f1b"]["scheduling"] == "1f1b" for r in run["rounds"])
        assert run["runtime_envpipe"]["scheduling"] == "envpipe"
        assert len(run["stage_ends"]["measured_s"]) == len(run["stage_ends"]["predicted_s"]) == 2
        plan = run["deployable_plan"]
        assert plan["label"].startswith("simulated") and plan["plan"]["num_microbatches"] == run["M"]
    md = (tmp_path / "runtime_h200.md").read_text()
    for heading in ("## Throughput, energy and memory", "## Predicted vs measured", "## Unit times per stage",
                    "## The plan the planner would deploy"):  # fmt: skip
        assert heading in md
    assert "| 2 | 4 | EnvPipe |" in md and "Stage 0 |" in md and "Command: `STAGES=" in md
    assert "cpus:" in (tmp_path / "machine.txt").read_text()


def test_results_renderer_refuses_an_empty_directory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "runtime_results.py"), str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "no */bench.json" in proc.stderr

"""The GPU benchmark scripts in their CPU mode (tiny model, gloo, simulated GPU), so that a run on a lent GPU
cannot fail on a typo: benchmarks/runtime_gpu.sh -> runtime_bench.py (each engine under torchrun, in processes
of its own) -> runtime_results.py dropin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envpipe.runtime.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_runtime_benchmark_scripts_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "CPU": "1", "OUT": str(out), "PYTHON": sys.executable, "ROUNDS": "2", "STEPS": "20",
           "MICROBATCHES": "4", "PLAN_RUNS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "runtime_gpu.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    bench = json.loads((out / "bench.json").read_text())
    assert [(r["round"], r["engine"]) for r in bench["runs"]] == [(0, "stock"), (0, "envpipe"), (1, "envpipe"),
                                                                   (1, "stock"), (0, "envpipe-plan")]
    for run in bench["runs"]:
        s = RunSummary.load(out / run["folder"] / "summary.json")
        assert s.engine == ("stock-deepspeed-1f1b" if run["engine"] == "stock" else "envpipe")
        if run["engine"] == "envpipe":  # the throughput pair's drop-in engine runs DeepSpeed's order
            assert s.plan is not None and s.plan.order == "1f1b"
        if run["engine"] == "envpipe-plan":  # the default policy, interleaved with 1F1B iterations
            assert s.plan is not None and s.plan.policy == "optimal" and s.measured is not None
    md = (out / "dropin.md").read_text()
    assert "## Throughput and memory" in md and "## Predictions against measurements" in md
    assert "## The default policy's plan deployed" in md and "ENVPIPE_SCHEDULING=1f1b" in md
    assert "— (times of two kinds)" in md  # CPU: wall-clock stock against a simulated GPU: no ratio
    assert "torch 2.13.0" in (out / "machine.txt").read_text()


def test_renderers_refuse_an_empty_directory(tmp_path: Path) -> None:
    for kind, message in (("rounds", "no */bench.json"), ("dropin", "bench.json: no such"),
                          ("ablation", "ablation.json: no such")):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "runtime_results.py"), kind, str(tmp_path)],
                              capture_output=True, text=True)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


def test_benchmark_refuses_bad_arguments(tmp_path: Path) -> None:
    for args, message in ((["--models", "gpt5"], "unknown model(s) gpt5"), (["--rounds", "-1"], "--rounds >= 0"),
                          (["--gpus", "0"], "must be >= 1"),
                          (["--out", str(tmp_path)], "exists: give a new folder")):
        argv = [sys.executable, str(ROOT / "benchmarks" / "runtime_bench.py"), "--out", str(tmp_path / "new"), *args]
        proc = subprocess.run(argv, capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr and not (tmp_path / "new").exists()

"""`make demo`, the README's first command, end to end: progress lines, the loss of every iteration, the
report with both comparisons, a summary that follows its schema, and the same numbers on a second run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runtime_summary import read_summary

ROOT = Path(__file__).resolve().parents[2]


def _demo(out: Path) -> subprocess.CompletedProcess[str]:
    # the test's own interpreter's venv (make's default .venv is the same one in a checkout)
    venv = str(Path(sys.executable).parent.parent)
    return subprocess.run(["make", "-s", "demo", f"OUTDIR={out}", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "MAKEFLAGS": ""})


@pytest.mark.slow
def test_make_demo_shows_the_product_and_repeats(tmp_path: Path) -> None:
    first = _demo(tmp_path / "a")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = first.stdout
    for phase in ("calibrate:", "profile:", "decide: optimal", "steady:"):
        assert f"[envpipe] {phase}" in out, out[-3000:]
    assert out.count("[envpipe] steady       ") == 12 and "loss" in out  # one line per steady iteration
    assert "the plan's iterations vs its interleaved 1F1B all-max iterations" in out
    assert "the planner's prediction vs its own 1F1B all-max baseline" in out
    summary = read_summary(tmp_path / "a" / "runtime")
    assert summary.plan is not None and summary.plan.policy == "optimal" and summary.plan.deployed
    m, p = summary.measured, summary.predicted
    assert m is not None and m.energy_saving is not None and p is not None
    assert m.slowdown.median <= 0.01 and m.energy_saving.median > 0.02  # it saves, at no more than 1% slowdown
    second = _demo(tmp_path / "b")
    assert second.returncode == 0, second.stderr[-3000:]
    again = read_summary(tmp_path / "b" / "runtime").measured
    assert again is not None and again.energy_saving is not None
    assert abs(again.energy_saving.median - m.energy_saving.median) < 0.015  # two runs agree within 1.5 pp


@pytest.mark.slow
def test_make_demo_failure_is_one_error_line(tmp_path: Path) -> None:
    venv = str(Path(sys.executable).parent.parent)
    proc = subprocess.run(["make", "-s", "demo", f"OUTDIR={tmp_path}", f"VENV={venv}", "DEMO_ARGS=--microbatches 0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "train_gpt.py: error: --microbatches must be >= 1" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr

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


def measured_words_only_on_measurements(text: str) -> list[str]:
    """Lines that call a number "measured" on a run whose GPU is simulated, except the two things on CPU that
    are measured for real: the host's wall-clock throughput and the bytes of the process's tensors."""
    return [line for line in text.splitlines() if "measured" in line
            and "wall clock" not in line and "memory (measured)" not in line]


@pytest.mark.slow
def test_make_demo_learns_saves_and_repeats_to_the_joule(tmp_path: Path) -> None:
    first = _demo(tmp_path / "a")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = first.stdout
    for phase in ("calibrate:", "profile:", "decide: optimal", "steady:"):
        assert f"[envpipe] {phase}" in out, out[-3000:]
    lines = [x for x in out.splitlines() if x.startswith("[envpipe]") and "loss" in x]
    assert len(lines) == 30 and all("/30 " in x and " J (rank 0's GPU, simulated)" in x for x in lines)
    losses = [float(x.split("loss ")[1].split()[0]) for x in lines]
    assert losses[-1] < losses[0] - 2.0, losses  # the counting task is learned: ln(512) = 6.24 at the start
    report = (tmp_path / "a" / "runtime" / "report.txt").read_text()
    assert "the plan's iterations vs its interleaved 1F1B all-max iterations" in report
    assert "a planner knowing its hidden truth saves" in report  # the oracle beside what profiling achieved
    assert measured_words_only_on_measurements(out + report) == []
    summary = read_summary(tmp_path / "a" / "runtime")
    assert summary.plan is not None and summary.plan.policy == "optimal" and summary.plan.deployed
    m, o, e = summary.measured, summary.oracle, summary.energy
    assert m is not None and m.energy_saving is not None and o is not None and e is not None
    assert m.slowdown.median <= 0.015 and m.energy_saving.median > 0.03  # it saves, at little slowdown
    assert o.energy_saving >= o.planner_energy_saving - 1e-9
    assert abs(e.error) < 0.03 and all(abs(x.error) < 0.03 for x in e.stages)  # the energy model, within 3 %
    second = _demo(tmp_path / "b")
    assert second.returncode == 0, second.stderr[-3000:]
    again = read_summary(tmp_path / "b" / "runtime")
    assert again.measured == m and again.steady == summary.steady and again.oracle == o  # the same, to the bit


@pytest.mark.slow
def test_make_demo_failure_is_one_error_line(tmp_path: Path) -> None:
    venv = str(Path(sys.executable).parent.parent)
    proc = subprocess.run(["make", "-s", "demo", f"OUTDIR={tmp_path}", f"VENV={venv}", "DEMO_ARGS=--microbatches 0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "train_gpt.py: error: argument --microbatches: '0': must be a positive finite number" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr

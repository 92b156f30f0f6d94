"""The dev-loop benchmark (issue #36): a fresh clone's install, demo and test read back with their load, the
verdict on `make test`, bad input refused in one line. Its committed results file is re-rendered by
tests/benchmarks/test_rendered.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import dev_loop
from benchmarks.common import ROOT

PYTEST_TAIL = ("===== slowest 15 durations =====\n12.00s call tests/x.py::test_y\n"
               "1203 passed, 2 skipped in 250.12s (0:04:10)\n")


def _step(target: str, wall: float, rc: int = 0, during: list[float] | None = None) -> dict[str, object]:
    return {"target": target, "wall_s": wall, "returncode": rc, "load_before": [1.5, 2.0, 3.0],
            "load_after": [4.0, 2.0, 3.0], "load_during": during or [],
            "output": PYTEST_TAIL if target == "test" else ""}


def _run(busy: int, test_wall: float, test_rc: int = 0) -> dict[str, object]:
    return {"commit": "0123456789abcdef", "started": "2026-11-28 10:00:00 UTC", "machine": "vm: 2 cores",
            "busy_loops": busy, "steps": [_step("install", 60.0), _step("demo", 70.5, during=[3.0, 5.0]),
                                          _step("test", test_wall, test_rc, during=[6.0, 8.0, 10.0])]}


def test_a_folder_renders_each_step_with_its_load_and_the_verdict(tmp_path: Path) -> None:
    folder = tmp_path / "loop"
    folder.mkdir()
    (folder / "1_busy0.json").write_text(json.dumps(_run(0, 250.1)))
    (folder / "2_busy4.json").write_text(json.dumps(_run(4, 340.0, test_rc=1)))
    text = dev_loop.render([folder])
    assert "| `make demo` | 70.5 s | 70.5 s |" in text
    assert "| `make test` | **250.1 s**, 1203 passed, 2 skipped | **340.0 s**, 1203 passed, 2 skipped |" in text
    assert "| load average (1 min) of `make test` | 1.5 before, 4.0 after; during: mean 8.0, max 10.0 |" in text
    assert "- `make test` with 0 busy loop(s): green, 250.1 s; under the 300 s target by 50 s." in text
    assert "- `make test` with 4 busy loop(s): red (exit 1), 340.0 s." in text  # the time target is the idle one's
    (folder / "1_busy0.json").write_text(json.dumps(_run(0, 310.0)))
    assert "- `make test` with 0 busy loop(s): green, 310.0 s; over the 300 s target." in dev_loop.render([folder])


def test_a_run_that_stopped_early_shows_what_did_not_run(tmp_path: Path) -> None:
    folder = tmp_path / "loop"
    folder.mkdir()
    run = _run(0, 1.0)
    run["steps"] = [_step("install", 3.0, rc=2)]
    (folder / "1_busy0.json").write_text(json.dumps(run))
    text = dev_loop.render([folder])
    assert "| `make install` | 3.0 s, failed (exit 2) |" in text and "| `make test` | not run |" in text


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.dev_loop", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cases = [(["render", str(tmp_path / "missing")], "not a folder of runs"),
             (["render", str(tmp_path / "empty")], "no run (N_busyK.json)"),
             (["measure", str(tmp_path / "x"), "--busy", "-1"], "must be a whole number of busy loops"),
             (["measure", str(tmp_path / "x"), "--commit", "not-a-commit"], "is not a commit of")]
    for args, message in cases:
        proc = run(*args)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3

"""The setup-time benchmark (issue #27): make's progress lines read back, what the venv holds, bad input refused
in one line. Its committed results file is re-rendered by tests/benchmarks/test_rendered.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import setup_time
from benchmarks.common import ROOT

OUTPUT = """make: python venv .venv with uv 0.13.9 ... 6.9 s
make: torch 2.13.0, the CPU build (from /opt/wheels) ... 15.2 s
a line of something else ... 3.0 s
make: envpipe[train]: DeepSpeed, transformers, the planner ... 17.0 s
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.setup_time", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_steps_are_read_from_makes_progress_lines() -> None:
    assert setup_time.steps(OUTPUT) == [("python venv .venv with uv 0.13.9", 6.9),
                                        ("torch 2.13.0, the CPU build (from /opt/wheels)", 15.2),
                                        ("envpipe[train]: DeepSpeed, transformers, the planner", 17.0)]


def test_what_the_venv_holds_names_any_cuda_package() -> None:
    cpu = {"packages": ["torch==2.13.0+cpu", "nvidia-ml-py==13.615.71", "numpy==2.4.6"]}
    assert setup_time.installed(cpu) == "3 distributions, torch 2.13.0+cpu, no CUDA package"
    cuda = {"packages": ["torch==2.13.0", "nvidia-cublas==13.1.0", "nvidia-nccl-cu13==2.28.9"]}
    assert setup_time.installed(cuda).endswith("CUDA packages: nvidia-cublas, nvidia-nccl-cu13")


def _run_file(cache: str, wall: float, rc: int = 0) -> dict[str, object]:
    return {"commit": "0123456789abcdef", "subject": "a commit", "cache": cache, "started": "2026-11-25 04:00:00 UTC",
            "machine": "vm: 2 cores", "load_before": [1.0, 2.0, 3.0], "load_after": [2.0, 2.0, 3.0],
            "wall_s": wall, "returncode": rc, "output": OUTPUT if rc == 0 else OUTPUT.splitlines()[0],
            "packages": ["torch==2.13.0+cpu"] if rc == 0 else []}


def test_a_folder_renders_its_runs_and_the_verdict(tmp_path: Path) -> None:
    folder = tmp_path / "uv"
    folder.mkdir()
    for name, run_ in (("1_empty", _run_file("empty", 40.2)), ("2_empty", _run_file("empty", 95.5)),
                       ("3_warm", _run_file("warm", 20.0, rc=2))):
        (folder / f"{name}.json").write_text(json.dumps(run_))
    text = setup_time.render([folder])
    assert "| torch 2.13.0, the CPU build (from /opt/wheels) | 15.2 s | 15.2 s | - |" in text  # the failed run: -
    assert "| **`make demo-install`, wall clock** | **40.2 s** | **95.5 s** | failed (exit 2) |" in text
    assert "From an empty cache: 40.2 s, 95.5 s; the slowest is over the 90 s target by 5.5 s." in text


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cases = [(["render", str(tmp_path / "missing")], "not a folder of runs"),
             (["render", str(tmp_path / "empty")], "no run (N_empty.json, N_warm.json) in"),
             (["measure", str(tmp_path / "out"), "--commit", "no-such-commit"], "is not a commit of")]
    for args, message in cases:
        proc = run(*args)
        assert proc.returncode != 0 and proc.stdout == "", proc.stdout
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out").exists()  # a refused measurement leaves nothing behind
    runs = run("measure", str(tmp_path / "out"), "--runs", "0")
    assert runs.returncode == 2 and "must be a whole number of runs, 1 or more" in runs.stderr
    assert "Traceback" not in runs.stderr and not (tmp_path / "out").exists()

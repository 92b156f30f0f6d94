"""The planner cannot see into the simulated GPU, and the simulated GPU needs no torch to be imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.import_graph import imported_modules

ROOT = Path(__file__).resolve().parents[2]
PLANNER = ("plan", "profile", "search")  # what plans: it may only learn the truth by profiling


@pytest.mark.parametrize("package", PLANNER)
def test_no_planner_source_names_the_simulated_gpu(package: str) -> None:
    files = sorted((ROOT / "envpipe" / package).rglob("*.py"))
    assert files
    offenders = [str(f.relative_to(ROOT)) for f in files if names_simgpu(imported_modules(f))]
    assert offenders == []


def names_simgpu(modules: set[str]) -> bool:
    return any(m == "envpipe.simgpu" or m.startswith("envpipe.simgpu.") for m in modules)


@pytest.mark.parametrize("line", ["import envpipe.simgpu.gpu", "from envpipe import simgpu",
                                  "from envpipe.simgpu.truth import JobTruth", "import envpipe.simgpu as s"])
def test_the_scan_sees_every_form_of_import(tmp_path: Path, line: str) -> None:
    source = tmp_path / "m.py"
    source.write_text(f"def f():\n    {line}\n")
    assert names_simgpu(imported_modules(source))


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_planner_loads_no_simulated_gpu() -> None:
    code = ("import importlib, pkgutil, sys\n"
            f"for pkg in {PLANNER!r}:\n"
            "    base = importlib.import_module('envpipe.' + pkg)\n"
            "    for m in pkgutil.walk_packages(base.__path__, base.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('envpipe.simgpu')))")
    assert run_python(code) == "[]"


def test_simulated_gpu_imports_without_torch() -> None:
    code = ("import sys, envpipe.simgpu, envpipe.simgpu.flops\n"
            "print('torch' in sys.modules)")
    assert run_python(code) == "False"

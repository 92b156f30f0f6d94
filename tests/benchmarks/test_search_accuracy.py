"""The one-GPU accuracy benchmark of `envpipe search`: its results file is what the renderer makes of the
committed raw runs, the committed engine model is what the fit makes of the committed fit runs, and the
driver's CPU path (profile, search, train, pack) works end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.search_accuracy_results import RAW, render
from benchmarks.search_fit import fit, load_runs
from envpipe.search.engine import GPU, load_engine_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_renderer_reproduces_the_committed_results() -> None:
    assert render() == (ROOT / "benchmarks" / "results" / "search_accuracy.md").read_text()


def test_the_committed_engine_model_is_the_fit_of_the_committed_runs() -> None:
    """The search's default is today's fit of the first run's fit set (call3/engine.json, declared before the
    second run): memory terms only, their version 2 profiles have no unit calls to fit time terms with."""
    runs = load_runs(RAW / "call2" / "fit")
    engine, details = fit(runs, "2026-11-25")
    assert engine == GPU == load_engine_model(RAW / "call3" / "engine.json")
    assert (engine.host_scale, engine.unit_host_s, engine.iteration_s) == (1.0, 0.0, 0.0)
    first = load_engine_model(RAW / "fit.json")  # the first run's, kept as it was: the same memory terms
    assert first.fragmentation == engine.fragmentation
    assert first.outside_allocator_bytes == engine.outside_allocator_bytes
    # every fit run at least as much device memory predicted as it needed, in the memory terms fitted here
    assert all(r["inactive_split_over_allocated"] <= engine.fragmentation for r in details["runs"])
    assert all(r["outside_beyond_profile_bytes"] <= engine.outside_allocator_bytes for r in details["runs"])


def test_the_held_out_predictions_came_before_the_runs() -> None:
    """Each held-out run's predictions are those its found configuration carried, made with the engine model
    fitted on the fit set alone (named in the configuration)."""
    engine = json.loads((RAW / "call2" / "fit" / "engine.json").read_text())
    for run_path in (RAW / "call2" / "heldout").glob("*/runs/b*.json"):
        run = json.loads(run_path.read_text())
        configs = run_path.parents[1] / "configs"
        config = configs / run["config"] if run["config"] == "found.json" else configs / "top" / run["config"]
        found = json.loads(config.read_text())["envpipe_search"]
        assert run["predicted"] == found["predicted"]
        assert found["engine_model"] == engine["label"] and "gpt2_12x1024" in engine["label"]


@pytest.mark.slow
def test_the_driver_on_cpu(tmp_path: Path) -> None:
    """The CPU check: a 2-block model through both sets (profile, search, train at every size, no fit on CPU)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "benchmarks/search_accuracy.py", "--out", str(tmp_path / "out"), "--tiny",
                          "--archive", str(tmp_path / "archive")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no GPU runs to fit" in run.stdout
    with tarfile.open(tmp_path / "archive" / "search_accuracy.tar.gz") as tar:
        names = tar.getnames()
    for kind, sizes in (("fit", (1, 4, 16)), ("heldout", (1, 2, 4, 8, 16))):
        for b in sizes:
            assert f"{kind}/tiny/runs/b{b}.json" in names
        result = json.loads((tmp_path / "out" / kind / "tiny" / "runs" / f"b{sizes[-1]}.json").read_text())
        assert result["micro_batch"] == sizes[-1] and len(result["measured"]["iteration_s"]) == 4

"""The one-GPU accuracy benchmark of `envpipe search`: its results files are what the renderers make of the
committed raw runs (the first held-out run and the second), the committed engine model is what the fit makes
of the committed fit runs, the held-out predictions were written before their runs, the fit recovers known time
terms, the driver's iteration counts, the diagnostics' CPU paths, and the driver's CPU path (profile, search,
train, pack) end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks import host_speed
from benchmarks.layer_chain_check import check
from benchmarks.search_accuracy import micro_batch_sizes, timed_iterations
from benchmarks.search_fit import FitRun, fit, load_runs, predicted_iteration_s, spread_needed
from benchmarks.search_results import main
from benchmarks.search_study.call1 import render
from benchmarks.search_study.call3 import render as render_call3
from benchmarks.search_study.call4 import render as render_call4
from benchmarks.search_study.call6 import render as render_call6
from benchmarks.search_study.common import RAW
from envpipe.search.engine_model import GPU, EngineModel, load_engine_model
from envpipe.search.layers import NO_UNIT_CALLS, ModelShape, UnitCalls
from tests.support.layer_profiles import layer_profile

ROOT = Path(__file__).resolve().parents[2]


def test_the_renderer_reproduces_the_committed_results() -> None:
    assert render() == (ROOT / "benchmarks" / "results" / "search_accuracy.md").read_text()


def test_the_second_runs_renderer_reproduces_its_results() -> None:
    committed = (ROOT / "benchmarks" / "results" / "search_accuracy_call3.md").read_text()
    assert render_call3() == committed


def test_the_third_rounds_renderer_reproduces_its_results() -> None:
    committed = (ROOT / "benchmarks" / "results" / "search_accuracy_call4.md").read_text()
    assert render_call4() == committed


def test_one_renderer_takes_every_round_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call3"]) == 0
    assert capsys.readouterr().out == (ROOT / "benchmarks" / "results" / "search_accuracy_call3.md").read_text()
    with pytest.raises(SystemExit) as exc:
        main(["call9"])
    assert exc.value.code == 2
    assert "search_results.py: error: argument kind: invalid choice: 'call9'" in capsys.readouterr().err


def test_the_fifth_rounds_renderer_reproduces_its_results() -> None:
    committed = (ROOT / "benchmarks" / "results" / "search_accuracy_call6.md").read_text()
    assert render_call6() == committed


def test_the_fifth_rounds_held_out_predictions_came_before_its_runs() -> None:
    """call6: each held-out run's predictions (its band and regime too) are its found configuration's, searched with
    call6/engine.json, the fit set's engine model committed before the held-out call; and that file is the fit of
    the fit set's committed runs."""
    call = RAW / "call6"
    engine = load_engine_model(call / "engine.json")
    assert fit(load_runs(call / "run1" / "fit"), "2026-11-29")[0] == engine and engine.host_spread == 0.075
    for model in (call / "run2" / "heldout").iterdir():
        for path in (model / "runs").glob("b*[0-9].json"):
            run = json.loads(path.read_text())
            config = model / "configs" / ("found.json" if run["config"].endswith("found.json") else
                                          f"top/{Path(run['config']).name}")
            found = json.loads(config.read_text())["envpipe_search"]
            assert run["predicted"] == found["predicted"] and found["engine_model"] == engine.label
            assert {"time_band_s", "regime", "host_share"} <= set(run["predicted"])


@pytest.mark.parametrize(("call", "run"), [("call7", "run2"), ("call8", "run1")])
def test_the_graphed_rounds_held_out_predictions_came_before_their_runs(call: str, run: str) -> None:
    """call7 and call8: every declared held-out model and size ran graphed, its predictions its found configuration's,
    searched with --cuda-graphs and call7/engine.json; that file is the fit of call7's fit set (graphed runs too)."""
    engine = load_engine_model(RAW / "call7" / "engine.json")
    fit_runs = load_runs(RAW / "call7" / "run1" / "fit")
    assert all(r.graphed for r in fit_runs) and fit(fit_runs, "2026-11-29", step_per_parameter=True)[0] == engine
    ran = set()
    for path in (RAW / call / run / "heldout").glob("*/runs/b*[0-9].json"):
        result = json.loads(path.read_text())
        configs = path.parents[1] / "configs"
        config = json.loads((configs / ("found.json" if result["config"] == "found.json" else
                                        f"top/{result['config']}")).read_text())
        assert result["predicted"] == config["envpipe_search"]["predicted"]
        assert config["envpipe_search"]["engine_model"] == engine.label and config["envpipe"]["cuda_graphs"] is True
        assert result["measured"]["graphs"] == 1 and result["measured"]["memory"]["graph_pool_bytes"] > 0
        ran.add((path.parents[1].name, result["micro_batch"]))
    declared = json.loads((RAW / call / "shapes.json").read_text())["heldout"]["models"]
    assert ran == {(m["name"], b) for m in declared for b in m["micro_batch_sizes"]}


@pytest.mark.parametrize(("call", "engine"), [("call4", "call3"), ("call5", "call5")])
def test_the_third_rounds_predictions_came_before_its_runs(call: str, engine: str) -> None:
    """Each run's predictions are its found configuration's, searched with the declared engine model on a version 4
    profile; every declared model and size ran; the host's speed was read beside every profile and run."""
    label = json.loads((RAW / engine / "engine.json").read_text())["label"]
    ran = set()
    for run_path in (RAW / call).glob("run1/heldout/*/runs/b*.json"):
        run = json.loads(run_path.read_text())
        configs = run_path.parents[1] / "configs"
        config = configs / run["config"] if run["config"] == "found.json" else configs / "top" / run["config"]
        found = json.loads(config.read_text())["envpipe_search"]
        assert run["predicted"] == found["predicted"] and found["engine_model"] == label
        assert json.loads((run_path.parents[1] / "layers.json").read_text())["version"] == 4
        assert json.loads((run_path.parent / f"host_{run_path.name}").read_text())["window_medians_s"]
        ran.add((run_path.parents[1].name, run["micro_batch"]))
    declared = json.loads((RAW / call / "shapes.json").read_text())["heldout"]["models"]
    assert ran == {(m["name"], b) for m in declared for b in m["micro_batch_sizes"]}


def test_the_second_held_out_runs_predictions_came_before_them() -> None:
    """Each run's predictions are its found configuration's, searched with the declared engine model on a
    version 3 profile (its unit calls measured); every declared model and size ran."""
    call = RAW / "call3"
    engine = json.loads((call / "engine.json").read_text())
    ran = set()
    for run_path in call.glob("run*/heldout/*/runs/b*.json"):
        run = json.loads(run_path.read_text())
        configs = run_path.parents[1] / "configs"
        config = configs / run["config"] if run["config"] == "found.json" else configs / "top" / run["config"]
        found = json.loads(config.read_text())["envpipe_search"]
        assert run["predicted"] == found["predicted"] and found["engine_model"] == engine["label"]
        profile = json.loads((run_path.parents[1] / "layers.json").read_text())
        assert profile["version"] == 3 and profile["unit_calls"]["label"].startswith("measured")
        ran.add((run_path.parents[1].name, run["micro_batch"]))
    declared = json.loads((call / "shapes.json").read_text())["heldout"]["models"]
    assert ran == {(m["name"], b) for m in declared for b in m["micro_batch_sizes"]}


def test_the_committed_engine_models_are_the_fits_of_the_committed_runs() -> None:
    """The search's default is the fit of the third run's runs (call5/engine.json, made before the fourth run):
    time and memory terms, their version 4 profiles measured the unit calls. The second run's (call3/engine.json)
    is the first run's fit set's: memory terms only, their version 2 profiles have no unit calls. The host spread
    came after call5's file (which reads as spread 0): the same runs' fit gives the default its spread, and every
    other term and residual as committed."""
    engine, details = fit(load_runs(RAW / "call4" / "run1" / "heldout"), "2026-11-25")
    assert engine == GPU and replace(engine, host_spread=0.0) == load_engine_model(RAW / "call5" / "engine.json")
    committed = json.loads((RAW / "call5" / "fit_details.json").read_text())
    assert engine.host_scale == 1.22 and engine.host_spread == 0.116
    assert [{k: r[k] for k in c} for r, c in zip(details["runs"], committed["runs"], strict=True)] == committed["runs"]
    assert details["engine_model"] == {**committed["engine_model"], "host_spread": 0.116}
    explained = [r for r in details["runs"] if r["host_spread_needed"] is not None]
    assert {r["micro_batch"] for r in details["runs"] if r["host_spread_needed"] is None} == {8}  # device-bound
    assert max(r["host_spread_needed"] for r in explained) == pytest.approx(0.116, abs=1e-3)
    runs = load_runs(RAW / "call2" / "fit")
    engine, details = fit(runs, "2026-11-25")
    assert engine == load_engine_model(RAW / "call3" / "engine.json")
    assert (engine.host_scale, engine.unit_host_s, engine.iteration_s) == (1.0, 0.0, 0.0)
    first = load_engine_model(RAW / "fit.json")  # the first run's, kept as it was: the same memory terms
    assert first.fragmentation == engine.fragmentation
    assert first.outside_allocator_bytes == engine.outside_allocator_bytes
    # every fit run at least as much device memory predicted as it needed, in the memory terms fitted here
    assert all(r["inactive_split_over_allocated"] <= engine.fragmentation for r in details["runs"])
    assert all(r["outside_beyond_profile_bytes"] <= engine.outside_allocator_bytes for r in details["runs"])


@pytest.mark.slow  # two CLI runs of the fit: 7 s idle, 17-46 s at load; the fit itself: the fast test above
def test_the_fit_pools_several_folders_and_refuses_a_missing_one_in_one_line(tmp_path: Path) -> None:
    """call4's and call5's runs in one fit: 16 runs of four models; the same as fitting their runs together."""
    folders = [RAW / "call4" / "run1" / "heldout", RAW / "call5" / "run1" / "heldout"]
    out = tmp_path / "engine.json"
    run = subprocess.run([sys.executable, "benchmarks/search_fit.py", *map(str, folders), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    engine, _ = fit([r for folder in folders for r in load_runs(folder)], "2026-11-25")
    assert load_engine_model(out) == engine and "on 16 runs of" in engine.label
    missing = subprocess.run([sys.executable, "benchmarks/search_fit.py", str(folders[0]), str(tmp_path / "nope"),
                              "--out", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert (missing.returncode, missing.stderr) == (1, f"not a folder: {tmp_path / 'nope'}\n")
    assert not (tmp_path / "x.json").exists()


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
    """The CPU check: a 2-block model through both sets of the first run's declaration (profile, search, train at
    every size, no fit on CPU)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "benchmarks/search_accuracy.py", "--out", str(tmp_path / "out"), "--tiny",
                          "--shapes", str(RAW / "shapes.json"), "--archive", str(tmp_path / "archive")], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no GPU runs to fit" in run.stdout
    with tarfile.open(tmp_path / "archive" / "search_accuracy.tar.gz") as tar:
        names = tar.getnames()
    for kind, sizes in (("fit", (1, 4, 16)), ("heldout", (1, 2, 4, 8, 16))):
        for b in sizes:
            assert f"{kind}/tiny/runs/b{b}.json" in names
        result = json.loads((tmp_path / "out" / kind / "tiny" / "runs" / f"b{sizes[-1]}.json").read_text())
        assert result["micro_batch"] == sizes[-1] and len(result["measured"]["iteration_s"]) == 4


def test_timed_iterations() -> None:
    """The declared count, or enough to fill min_timed_s at the predicted time, at most max_iterations."""
    declared = {"warmup": 2, "iterations": 4, "min_timed_s": 4.0, "max_iterations": 12}
    assert timed_iterations(declared, 1.5) == {"warmup": 2, "iterations": 4}  # 3 would fill 4 s: 4 declared
    assert timed_iterations(declared, 0.7) == {"warmup": 2, "iterations": 6}  # ceil(4 / 0.7)
    assert timed_iterations(declared, 0.1) == {"warmup": 2, "iterations": 12}  # 40, capped
    assert timed_iterations({"warmup": 2, "iterations": 4}, 0.1) == {"warmup": 2, "iterations": 4}


def test_micro_batch_sizes_of_a_model() -> None:
    declared = {"models": [{"name": "a", "micro_batch_sizes": [1, 2]}, {"name": "b", "micro_batch_sizes": [4, 2]}]}
    assert micro_batch_sizes(declared, declared["models"][1]) == [4, 2]
    assert micro_batch_sizes({**declared, "micro_batch_sizes": [8]}, {"name": "tiny"}) == [8]
    assert micro_batch_sizes(declared, {"name": "tiny"}) == [1, 2, 4]  # the CPU check: every model's


def _run(profile, b: int, M: int, engine: EngineModel) -> FitRun:
    """A fit run whose measured time is what ``engine`` predicts for it."""
    run = FitRun("m", profile, b, M, "x", 0.0, 1 << 30, 1 << 30, 0, 1 << 28, "test")
    return replace(run, iteration_s=predicted_iteration_s(run, engine))


def test_the_fit_recovers_time_terms_from_profiles_with_unit_calls() -> None:
    """Runs made by a known engine (host scale 0.8, 0.5 ms per forward unit, 2 ms per iteration) on a profile that
    measured its unit calls, launch-bound at micro-batch 1 and 2 (host 2 + 4 ms a layer, device 0.67 + 1.33 ms
    times b^0.8) and device-bound at 4: the fit finds those terms again (the device-bound run tells the work per
    unit from the host's scale)."""
    calls = UnitCalls(1e-4, 2e-5, {1: 3e-4, 2: 3e-4, 4: 3e-4}, "test")
    profile = replace(layer_profile([2.0, 2.0, 2.0, 2.0], host_ms=[6.0] * 4), unit_calls=calls)
    truth = EngineModel(0.5e-3, 2e-3, 0.8, 0.0, 0, "x", "truth")
    runs = [_run(profile, b, M, truth) for b, M in ((1, 16), (2, 8), (4, 4))]
    engine, _ = fit(runs, "2026-11-25")
    assert engine.host_scale == pytest.approx(0.8)
    assert engine.unit_host_s == pytest.approx(0.5e-3, abs=1e-7) and engine.iteration_s == pytest.approx(2e-3, abs=1e-6)
    assert "time not fitted" not in engine.label


def test_graphed_runs_give_the_step_per_parameter_and_the_work_per_unit() -> None:
    """Graphed runs made by a known engine (0.5 ms per forward unit, 2 ms per iteration, 30 ps per parameter) on two
    models of 4 and 8 M parameters whose tails are that engine's (2 ms + parameters x 30 ps): the fit finds the step
    per parameter and t from the tails, h from the iterations, and leaves the host's scale at 1."""
    calls = UnitCalls(1e-4, 2e-5, {1: 3e-4, 2: 3e-4}, "test")
    truth = EngineModel(0.5e-3, 2e-3, 1.0, 0.0, 0, "x", "truth", step_per_parameter_s=3e-11)
    runs = []
    for params in (1_000_000, 2_000_000):
        profile = replace(layer_profile([2.0] * 4, host_ms=[6.0] * 4, sizes=(1, 2), params=[params] * 4),
                          unit_calls=calls)
        for b, M in ((1, 8), (2, 4)):
            run = replace(_run(profile, b, M, truth), graphed=True, tail_s=2e-3 + 4 * params * 3e-11)
            runs.append(replace(run, iteration_s=predicted_iteration_s(run, truth)))
    engine, details = fit(runs, "2026-11-29", step_per_parameter=True)
    assert engine.step_per_parameter_s == pytest.approx(3e-11, rel=1e-3)
    assert engine.iteration_s == pytest.approx(2e-3, abs=1e-6) and engine.unit_host_s == pytest.approx(0.5e-3, abs=1e-7)
    assert engine.host_scale == 1.0 and engine.host_spread == 0.0  # graphed units: no host band
    assert all(r["graphed"] for r in details["runs"])
    eager = replace(runs[0], graphed=False)  # the same run predicted eagerly: the host's launches set its pace
    assert predicted_iteration_s(eager, truth) > 2 * predicted_iteration_s(runs[0], truth)


def test_the_host_spread_is_the_least_that_holds_every_run_the_host_can_explain() -> None:
    """A launch-bound run measured as if its host were 6 % slower needs a spread of 6 %, one 3 % faster 3 %; a
    device-bound run 5 % off needs more than any spread gives (the host does not set its time): left out. The fit
    takes the largest the runs need, and its band then holds each explained run."""
    calls = UnitCalls(1e-4, 2e-5, {1: 3e-4, 2: 3e-4, 4: 3e-4, 8: 3e-4}, "test")
    profile = replace(layer_profile([2.0, 2.0, 2.0, 2.0], host_ms=[6.0] * 4, sizes=(1, 2, 4, 8)), unit_calls=calls)
    truth = EngineModel(0.0, 0.0, 1.0, 0.0, 0, "x", "truth")
    slow = _run(profile, 1, 16, replace(truth, host_scale=1.06))
    fast = _run(profile, 2, 8, replace(truth, host_scale=0.97))
    device = _run(profile, 8, 2, truth)
    device = replace(device, iteration_s=1.05 * device.iteration_s)
    assert spread_needed(slow, truth) == pytest.approx(0.06, abs=2e-4)
    assert spread_needed(fast, truth) == pytest.approx(0.03, abs=2e-4)
    assert spread_needed(device, truth) is None
    engine, details = fit([slow, fast, device], "2026-11-29")
    needed = [r["host_spread_needed"] for r in details["runs"]]
    assert needed[2] is None and engine.host_spread == pytest.approx(max(needed[:2]), abs=1e-3)
    for run in (slow, fast):
        low = predicted_iteration_s(run, replace(engine, host_scale=engine.host_scale * (1 - engine.host_spread)))
        high = predicted_iteration_s(run, replace(engine, host_scale=engine.host_scale * (1 + engine.host_spread)))
        assert low <= run.iteration_s * (1 + 1e-6) and run.iteration_s <= high * (1 + 1e-6)


def test_the_fit_leaves_time_alone_on_profiles_without_unit_calls() -> None:
    profile = layer_profile([1.0, 1.0, 1.0, 1.0], host_ms=[6.0] * 4)
    assert profile.unit_calls == NO_UNIT_CALLS
    runs = [_run(profile, 1, 16, EngineModel(0.5e-3, 2e-3, 0.8, 0.0, 0, "x", "truth"))]
    engine, _ = fit(runs, "2026-11-25")
    assert (engine.host_scale, engine.unit_host_s, engine.iteration_s) == (1.0, 0.0, 0.0)
    assert "time not fitted" in engine.label


def test_host_speed_windows_and_measure() -> None:
    """A 2 ms workload timed over 0.5 s: five 100 ms windows of about 2 ms each; measure() on CPU times the
    Python workload unpinned and pinned, with the steal counter where /proc/stat has one."""
    medians = host_speed.windows(lambda: time.sleep(2e-3), 0.5)
    assert 4 <= len(medians) <= 5 and all(1.9e-3 < m < 4e-3 for m in medians)
    result = host_speed.measure(0.2)
    runs = [(r["workload"], r["pinned"]) for r in result["runs"]]
    assert runs[:1] == [("python", False)] and ("python", True) in runs
    assert all(r["window_medians_s"] and (r["steal_ticks"] is None or r["steal_ticks"] >= 0) for r in result["runs"])


def test_host_watch_samples_while_open() -> None:
    """A watch open for 0.6 s with a window every 0.2 s: about three windows, each the python workload's median
    sample (microseconds here), nothing after it closed."""
    with host_speed.HostWatch(every_s=0.2) as watch:
        time.sleep(0.65)
    seen = len(watch.window_medians_s)
    assert 1 <= seen <= 4 and all(0 < m < 0.05 for m in watch.window_medians_s)
    time.sleep(0.3)
    assert len(watch.window_medians_s) == seen and watch.to_json()["every_s"] == 0.2


def test_layer_chain_check_on_cpu() -> None:
    """Two tiny GPT-2 blocks as one chain and as the profiler times them both ways: every pair has the chain's
    two host times (above 0) and each method's four (differences of two rounds: they may come out below 0 for
    so small a model on a busy CPU), the separate method's backward less the unit calls."""
    shape = ModelShape("gpt2", 2, 32, 2, 16, 64)
    pairs = check(shape, 2, 2, 0.0, torch.device("cpu"))
    assert len(pairs) == 2 and all(len(p) == 10 and min(p["chain_forward_s"], p["chain_backward_s"]) > 0
                                   for p in pairs)
    assert all(math.isfinite(v) for p in pairs for v in p.values())

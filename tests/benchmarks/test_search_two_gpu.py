"""The 2-GPU accuracy benchmark of `envpipe search`: its predictions (benchmarks/search_configs.py) are searched as
`envpipe search` is given (graphed, another engine model), every configuration trains what was predicted, and
when the predictions were made is written beside them; the committed rounds' predictions came before their runs,
and a round trained again kept the predictions it was declared with."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchmarks.search_links import search_options
from benchmarks.search_study.twogpu import opened
from envpipe.search.engine_model import load_engine_model

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "results" / "search_layers_gpt2_h200.json"  # measured on an H200
ENGINE = ROOT / "benchmarks" / "results" / "search_accuracy" / "call7" / "engine.json"
RAW = ROOT / "benchmarks" / "results" / "h200x2_runs"
# each round's archives of a model: the first trained as declared, the others the same predictions trained again
ROUNDS = {("call9", "gpt2"): ("search_gpt2_36x1152_1825", "search_gpt2_36x1152_retrain_1845"),
          ("call9", "llama"): ("search_llama_24x1792_1833", "search_llama_24x1792_retrain_1848"),
          ("call10", "gpt2"): ("search_gpt2_30x1344_2125",), ("call10", "llama"): ("search_llama_22x2176_2132",),
          ("call11", "gpt2"): ("search_gpt2_28x1408_2157", "search_gpt2_28x1408_rest_2205")}
LINKS = {"p2p_gbps": 300.0, "allreduce_bus_gbps": 150.0, "p2p_latency_us": 20.0}


def configs(tmp_path: Path, name: str, *extra: str) -> tuple[Path, list[dict]]:
    links = tmp_path / "links.json"
    links.write_text(json.dumps(LINKS))
    out = tmp_path / name
    run = subprocess.run([sys.executable, "benchmarks/search_configs.py", "--layers", str(PROFILE), "--gpus", "2",
                          "--global-batch", "16", "--memory-gib", "130", "--links", str(links), "--shift", "0",
                          "--out", str(out), *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    names = (out / "configs.txt").read_text().split()
    return out, [json.loads((out / f"{n}.json").read_text()) for n in names]


def test_graphed_configurations_with_an_engine_model_are_declared_before_their_runs(tmp_path: Path) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    out, graphed = configs(tmp_path, "graphed", "--cuda-graphs", "--engine-model", str(ENGINE))
    _, eager = configs(tmp_path, "eager", "--engine-model", str(ENGINE))
    names = (out / "configs.txt").read_text().split()
    shapes = {(c["envpipe"]["pipeline_stages"], c["envpipe_search"]["micro_batch"]) for c in graphed}
    assert shapes == {(p, b) for p in (1, 2) for b in (2, 4, 8)}  # every shape of 2 GPUs the profile has
    declared = json.loads((out / "declared.json").read_text())
    assert declared["configs"] == names and declared["cuda_graphs"] is True
    assert declared["engine_model"] == load_engine_model(ENGINE).label
    assert before <= datetime.fromisoformat(declared["at"]) <= datetime.now(UTC)
    for config in graphed:
        assert config["envpipe"]["cuda_graphs"] is True
        assert config["envpipe_search"]["engine_model"] == declared["engine_model"]
        assert config["envpipe_search"]["allocator"] == load_engine_model(ENGINE).allocator
    assert all("cuda_graphs" not in c["envpipe"] for c in eager)
    eager_by_shape = {(c["envpipe"]["pipeline_stages"], c["envpipe_search"]["micro_batch"]):
                      c["envpipe_search"]["predicted"] for c in eager}
    for config in graphed:  # predicted graphed: the same engine model, other numbers
        shape = (config["envpipe"]["pipeline_stages"], config["envpipe_search"]["micro_batch"])
        assert config["envpipe_search"]["predicted"]["peak_memory_bytes_per_stage"] != \
            eager_by_shape[shape]["peak_memory_bytes_per_stage"], shape


@pytest.mark.parametrize(("call", "model"), sorted(ROUNDS))
def test_each_rounds_predictions_came_before_its_runs_and_runs_trained_again_kept_them(call: str, model: str) -> None:
    declared_at, predicted = None, {}
    for archive in ROUNDS[(call, model)]:
        with opened(RAW / f"{archive}.tar.gz") as out:
            declared = json.loads((out / model / "configs" / "declared.json").read_text())
            at = datetime.fromisoformat(declared["at"]).timestamp()
            assert declared_at in (None, at)  # the retrained runs: the same declaration
            declared_at = at
            runs = sorted((out / model / "runs").glob("*.json"))
            assert runs and {r.stem for r in runs} <= set(declared["configs"])
            for run in runs:
                first = json.loads((out / model / f"report_{run.stem}" / "iterations.rank0.jsonl").open().readline())
                assert first["wall_time"] > at, (archive, run.stem)
                p = json.loads(run.read_text())["predicted"]
                assert predicted.setdefault(run.stem, p) == p, (archive, run.stem)


def _layout_run(runs: Path, stages: int, replicas: int, outside: list[int] | None) -> None:
    measured = {} if outside is None else {"outside_allocator_bytes_per_stage": outside}
    (runs / f"P{stages}_D{replicas}.json").write_text(json.dumps(
        {"shape": {"stages": stages, "replicas": replicas}, "measured": measured}))


def test_a_communicators_memory_is_what_the_layouts_hold_beyond_one_gpu_over_their_groups(tmp_path: Path) -> None:
    """benchmarks/search_comms.py: each layout's stages' bytes outside the allocator less the one-GPU run's, over
    the communicators each holds (P = 2: 6 per stage, P = 1 x D = 2: 3), written into the links file and printed
    as `envpipe search`'s option; gloo runs measure nothing (0, labelled); no one-GPU run is one clear line."""
    runs, links = tmp_path / "runs", tmp_path / "links.json"
    runs.mkdir()
    links.write_text(json.dumps(LINKS))
    mib = 1 << 20
    _layout_run(runs, 1, 1, [1000 * mib])
    _layout_run(runs, 2, 1, [4000 * mib, 3400 * mib])  # 3000 and 2400 MiB beyond over 6 + 6
    _layout_run(runs, 1, 2, [2500 * mib])  # 1500 MiB over 3
    command = [sys.executable, "benchmarks/search_comms.py", str(runs), "--links", str(links)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    comm = json.loads(links.read_text())["communicators"]
    assert comm["per_group_bytes"] == round((3000 + 2400 + 1500) * mib / 15)
    assert comm["by_layout"] == {"P1_D2": {"extra_bytes_per_stage": [1500 * mib], "communicators_per_stage": [3]},
                                 "P2_D1": {"extra_bytes_per_stage": [3000 * mib, 2400 * mib],
                                           "communicators_per_stage": [6, 6]}}
    assert search_options(json.loads(links.read_text())).endswith(f"--communicator-mib {6900 / 15:.6g}")
    for path in runs.iterdir():
        path.unlink()
    _layout_run(runs, 1, 1, None)
    _layout_run(runs, 2, 1, None)
    assert subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120).returncode == 0
    assert json.loads(links.read_text())["communicators"] == {"per_group_bytes": 0,
                                                               "label": "none: no GPU (gloo holds no device memory)"}
    (runs / "P1_D1.json").unlink()
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.strip() == "search_comms.py: no 1 x 1 run to compare the layouts with"

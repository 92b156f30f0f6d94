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

from benchmarks.search_study.twogpu import opened
from envpipe.search.engine_model import load_engine_model

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "results" / "search_layers_gpt2_h200.json"  # measured on an H200
ENGINE = ROOT / "benchmarks" / "results" / "search_accuracy" / "call7" / "engine.json"
RAW = ROOT / "benchmarks" / "results" / "h200x2_runs"
CALL9 = {"gpt2": ("search_gpt2_36x1152_1825", "search_gpt2_36x1152_retrain_1845"),
         "llama": ("search_llama_24x1792_1833", "search_llama_24x1792_retrain_1848")}
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


@pytest.mark.parametrize("model", sorted(CALL9))
def test_call9s_predictions_came_before_its_runs_and_the_retrained_runs_kept_them(model: str) -> None:
    declared_at, predicted = None, {}
    for archive in CALL9[model]:
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

"""benchmarks/search_configs.py, the 2-GPU accuracy benchmark's predictions: searched as `envpipe search` is given
(graphed, another engine model), every configuration trains what was predicted, and when the predictions were
made is written beside them, before any run."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from envpipe.search.engine_model import load_engine_model

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "results" / "search_layers_gpt2_h200.json"  # measured on an H200
ENGINE = ROOT / "benchmarks" / "results" / "search_accuracy" / "call7" / "engine.json"
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

"""The configurations the accuracy benchmark trains: every shape `envpipe search` finds feasible on the given
GPUs (each with its best cut and optimal plan), and for the fastest multi-stage shape its cut moved by
``--shift`` layers either way (worse cuts, predicted the same way), as found configurations for
examples/train_gpt.py.

    python benchmarks/search_configs.py --layers layers.json --gpus 2 --global-batch 16 --memory-gib 1 \
        --links links.json --out configs/
    python benchmarks/search_configs.py ... --cuda-graphs --engine-model engine.json   # as `envpipe search` takes them

Writes OUT/<name>.json and OUT/<name>.plan.json per configuration, OUT/configs.txt (one name a line) and
OUT/declared.json (when the predictions were made, by which code and engine model: before any run of them).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envpipe.search.cluster import GIB, Cluster  # noqa: E402
from envpipe.search.cut import Cut  # noqa: E402
from envpipe.search.engine_model import engine_model, load_engine_model  # noqa: E402
from envpipe.search.evaluate import Candidate, build_pipeline, plan_pipeline  # noqa: E402
from envpipe.search.found import found_config  # noqa: E402
from envpipe.search.inputs import SearchInputs  # noqa: E402
from envpipe.search.layers import load_layer_profile  # noqa: E402
from envpipe.search.memory import MemoryTables  # noqa: E402
from envpipe.search.search import Objective, SearchOptions, search  # noqa: E402


def cluster_from(links_path: str, gpus: int, memory_gib: float) -> Cluster:
    """One node of ``gpus`` GPUs with the links measured by benchmarks/search_links.py (and a communicator's memory
    where benchmarks/search_comms.py measured it: files before 2026-11-29 22:00 UTC have none)."""
    links = json.loads(Path(links_path).read_text())
    p2p = links["p2p_gbps"] * 1e9
    return Cluster(1, gpus, int(memory_gib * GIB), p2p, p2p, links["p2p_latency_us"] * 1e-6,
                   links["allreduce_bus_gbps"] * 1e9, 0, links.get("communicators", {}).get("per_group_bytes", 0))


def shifted(candidate: Candidate, inputs: SearchInputs, shift: int) -> list[Candidate]:
    """The candidate with its first cut moved ``shift`` layers either way, where that still fits."""
    counts = candidate.pipeline.cut.counts
    shape = candidate.shape
    tables = MemoryTables(inputs.layers, shape.micro_batch, shape.replicas, shape.microbatches, inputs.graphed)
    cluster = inputs.cluster
    out = []
    for delta in (-shift, shift):
        moved = (counts[0] + delta, counts[1] - delta, *counts[2:])
        if min(moved) < 1:
            continue
        other = plan_pipeline(build_pipeline(inputs, shape, Cut(moved, 0.0), tables), cluster.memory_bytes)
        if max(other.peak_bytes) <= cluster.memory_bytes:
            out.append(other)
    return out


def name(candidate: Candidate) -> str:
    s = candidate.shape
    return f"P{s.stages}_D{s.replicas}_b{s.micro_batch}_cut{'-'.join(map(str, candidate.pipeline.cut.counts))}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--memory-gib", type=float, required=True)
    p.add_argument("--links", required=True, help="benchmarks/search_links.py's JSON")
    p.add_argument("--shift", type=int, default=2, help="layers to move the fastest multi-stage shape's first cut")
    p.add_argument("--cuda-graphs", action="store_true", help="predict the units replayed as CUDA graphs")
    p.add_argument("--engine-model", help="an engine model file (benchmarks/search_fit.py's; default: the search's)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    layers = load_layer_profile(args.layers)
    cluster = cluster_from(args.links, args.gpus, args.memory_gib)
    engine = load_engine_model(args.engine_model) if args.engine_model else engine_model(layers)
    inputs = SearchInputs(layers, cluster, engine, args.cuda_graphs)
    result = search(inputs, args.global_batch, Objective("throughput"), SearchOptions(top_k=1000))
    chosen = list(result.candidates)
    multi = [c for c in result.candidates if c.shape.stages > 1]  # fastest first
    if multi and args.shift:
        chosen += shifted(multi[0], inputs, args.shift)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for c in chosen:
        n = name(c)
        c.plan.save(out / f"{n}.plan.json")
        config = found_config(c, layers, cluster, f"{n}.plan.json", engine, args.cuda_graphs)
        (out / f"{n}.json").write_text(json.dumps(config, indent=1) + "\n")
        names.append(n)
    (out / "configs.txt").write_text("".join(f"{n}\n" for n in names))
    (out / "declared.json").write_text(json.dumps({
        "at": datetime.now(UTC).isoformat(timespec="seconds"), "configs": names, "cuda_graphs": args.cuda_graphs,
        "engine_model": engine.label}, indent=1) + "\n")
    print(f"{len(names)} configurations ({result.stats.shapes} shapes, {result.stats.infeasible} do not fit): "
          + ", ".join(names))


if __name__ == "__main__":
    main()

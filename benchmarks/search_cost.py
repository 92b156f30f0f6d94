"""What `envpipe search` costs: wall time and configurations considered, infeasible, pruned and planned, per
objective, for a layer profile and a cluster (default: 4 nodes x 8 GPUs), on this machine.

    python benchmarks/search_cost.py --layers layers_gpt2_48.json --nodes 4 --gpus-per-node 8 \
        --global-batch 512 --memory-gib 80,40

Prints a markdown table (measured: wall time of the search in this process; the predictions inside are
simulated). Each objective and memory per GPU is searched ``--repeats`` times; the table gives the median and
the range.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envpipe.search.cluster import GIB, Cluster
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import load_layer_profile
from envpipe.search.search import Objective, SearchOptions, search
from envpipe.search.space import MAX_PLAN_UNITS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", required=True)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--memory-gib", default="80", help="memory per GPU, GiB; several separated by commas")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    layers = load_layer_profile(args.layers)
    memories = [float(x) for x in args.memory_gib.split(",")]
    m = layers.model
    print(f"Search cost, measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} CPUs "
          f"visible, load average {os.getloadavg()[0]:.1f}), Python {platform.python_version()}.\n")
    print(f"Layer profile {args.layers}: {m.family} {m.layers} blocks (hidden {m.hidden}, seq {m.seq}), "
          f"{layers.num_layers} pipeline layers, micro-batch sizes {list(layers.micro_batch_sizes)}, measured on "
          f"{layers.device} ({layers.dtype}, {layers.date}). Cluster: {args.nodes} x {args.gpus_per_node} GPUs, "
          f"links assumed (150 GB/s in a node, 12.5 GB/s between); global batch {args.global_batch}; top "
          f"{args.top_k}; iterations over {MAX_PLAN_UNITS} units keep their 1F1B all-max plan.\n")
    print("| memory per GPU | objective | search wall time (s): median (min-max) | configurations | do not fit | "
          "miss the floor | pruned | planned (of them too large) | best (simulated) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for memory in memories:
        # NVLink within a node, 100 Gb/s between nodes (assumed: no such cluster is measured here)
        cluster = Cluster(args.nodes, args.gpus_per_node, int(memory * GIB), 150e9, 12.5e9, 20e-6, 150e9)
        for objective in (Objective("throughput"), Objective("energy", max_slowdown=0.05), Objective("frontier")):
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                result = search(SearchInputs.of(layers, cluster), args.global_batch, objective,
                                SearchOptions(args.top_k))
                times.append(time.perf_counter() - t0)
            s, best = result.stats, result.candidates[0]
            label = objective.kind + (" (at most 5% slower than the fastest)" if objective.kind == "energy" else "")
            print(f"| {memory:g} GiB | {label} | {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}) | "
                  f"{s.shapes} | {s.infeasible} | {s.too_slow} | {s.pruned} | {s.planned} ({s.not_planned}) | "
                  f"{best.shape.label()}, {best.iteration_time_s:.3f} s, {best.energy_j / 1e3:.1f} kJ, {best.order} |")


if __name__ == "__main__":
    main()

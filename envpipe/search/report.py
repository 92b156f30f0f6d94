"""What a search hands back: the top-k as JSON, a text table, and a picture of time against energy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envpipe.search.cluster import GIB, Cluster
from envpipe.search.evaluate import Candidate
from envpipe.search.found import predicted, simulated_label
from envpipe.search.layers import LayerProfile
from envpipe.search.search import SearchResult

RESULT_VERSION = 1


def configuration(candidate: Candidate) -> dict[str, Any]:
    shape = candidate.shape
    return {
        "stages": shape.stages,
        "replicas": shape.replicas,
        "micro_batch": shape.micro_batch,
        "microbatches": shape.microbatches,
        "stage_layers": list(candidate.pipeline.cut.counts),
        "predicted": predicted(candidate),
    }


def result_json(result: SearchResult, layers: LayerProfile, cluster: Cluster, global_batch: int) -> dict[str, Any]:
    stats = result.stats
    return {
        "version": RESULT_VERSION,
        "label": simulated_label(layers),
        "objective": {"kind": result.objective.kind, "min_throughput": result.objective.min_throughput,
                      "max_slowdown": result.objective.max_slowdown, "time_budget_s": result.time_budget_s},
        "gpus": {"nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
                 "memory_bytes": cluster.memory_bytes, "intra_node_bytes_per_s": cluster.intra_node_bytes_per_s,
                 "inter_node_bytes_per_s": cluster.inter_node_bytes_per_s, "latency_s": cluster.latency_s,
                 "allreduce_intra_bytes_per_s": cluster.allreduce_intra_bytes_per_s},
        "global_batch": global_batch,
        "search": {"configurations": stats.shapes, "infeasible_memory": stats.infeasible, "pruned": stats.pruned,
                   "too_slow": stats.too_slow, "planned": stats.planned, "not_planned": stats.not_planned,
                   "seconds": stats.seconds},
        "configurations": [configuration(c) for c in result.candidates],
    }


def table(result: SearchResult) -> str:
    head = (f"{'#':>2} {'P':>3} {'D':>3} {'b':>3} {'M':>4}  {'stage layers':<18} {'order':<16} {'iteration':>10} "
            f"{'samples/s':>10} {'energy/iter':>12} {'saving':>7}  peak memory per stage (GiB)")
    lines = [head]
    for i, c in enumerate(result.candidates, 1):
        s = c.shape
        cut = ",".join(map(str, c.pipeline.cut.counts))
        peaks = " ".join(f"{p / GIB:.2f}" for p in c.peak_bytes)
        lines.append(f"{i:>2} {s.stages:>3} {s.replicas:>3} {s.micro_batch:>3} {s.microbatches:>4}  {cut:<18.18} "
                     f"{c.order:<16.16} {c.iteration_time_s * 1e3:>8.2f}ms {c.throughput():>10.1f} "
                     f"{c.energy_j:>10.1f} J {100 * c.saving:>6.1f}%  {peaks}")
    return "\n".join(lines)


def draw_frontier(result: SearchResult, path: str | Path) -> None:
    """Every planned configuration (iteration time, job energy per iteration), the top k or frontier marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([c.iteration_time_s for c in result.planned], [c.energy_j for c in result.planned], s=18,
               color="0.6", label="planned configurations")
    chosen = sorted(result.candidates, key=lambda c: c.iteration_time_s)
    ax.plot([c.iteration_time_s for c in chosen], [c.energy_j for c in chosen], "o-", color="tab:blue",
            label="frontier" if result.objective.kind == "frontier" else f"top {len(chosen)}")
    best = result.candidates[0]
    ax.plot([best.iteration_time_s], [best.energy_j], "*", ms=14, color="tab:red", label=best.shape.label())
    if result.time_budget_s is not None:
        ax.axvline(result.time_budget_s, ls="--", color="tab:orange", label="throughput floor")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration, all GPUs (J)")
    ax.set_title(f"configurations, objective {result.objective.kind} (simulated)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

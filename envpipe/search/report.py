"""What a search hands back: the top-k as JSON, a text table, and a picture of time against energy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from envpipe.search.band import HostBand
from envpipe.search.cluster import GIB, Cluster
from envpipe.search.evaluate import Candidate
from envpipe.search.found import predicted, simulated_label
from envpipe.search.layers import LayerProfile
from envpipe.search.search import SearchResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RESULT_VERSION = 1


def configuration(candidate: Candidate, band: HostBand) -> dict[str, Any]:
    shape = candidate.shape
    return {
        "stages": shape.stages,
        "replicas": shape.replicas,
        "micro_batch": shape.micro_batch,
        "microbatches": shape.microbatches,
        "stage_layers": list(candidate.pipeline.cut.counts),
        "predicted": {**predicted(candidate), **band.to_json()},
    }


def result_json(result: SearchResult, layers: LayerProfile, cluster: Cluster, global_batch: int) -> dict[str, Any]:
    stats = result.stats
    return {
        "version": RESULT_VERSION,
        "label": simulated_label(layers),
        "objective": {"kind": result.objective.kind, "min_throughput": result.objective.min_throughput,
                      "max_slowdown": result.objective.max_slowdown, "time_budget_s": result.time_budget_s},
        "gpus": {"nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
                 "memory_bytes": cluster.memory_bytes, "memory_margin_bytes": cluster.margin_bytes,
                 "intra_node_bytes_per_s": cluster.intra_node_bytes_per_s,
                 "inter_node_bytes_per_s": cluster.inter_node_bytes_per_s, "latency_s": cluster.latency_s,
                 "allreduce_intra_bytes_per_s": cluster.allreduce_intra_bytes_per_s},
        "global_batch": global_batch,
        "search": {"configurations": stats.shapes, "infeasible_memory": stats.infeasible, "pruned": stats.pruned,
                   "too_slow": stats.too_slow, "planned": stats.planned, "not_planned": stats.not_planned,
                   "seconds": stats.seconds},
        "configurations": [configuration(c, band) for c, band in zip(result.candidates, result.bands, strict=True)],
        "undecided": result.undecided,  # ranks the host's speed could put first (their bands overlap the first's)
    }


def table(result: SearchResult) -> str:
    """The top k, one line each: shape, cut, order, predicted time (with its host band and regime), throughput,
    energy, saving, peak memory; then which ranks the host's speed could swap with the first."""
    head = (f"{'#':>2} {'P':>3} {'D':>3} {'b':>3} {'M':>4}  {'stage layers':<18} {'order':<16} {'iteration':>10} "
            f"{'host band':>15} {'regime':<12} {'samples/s':>10} {'energy/iter':>12} {'saving':>7}  "
            "peak memory per stage (GiB)")
    lines = [head]
    for i, (c, band) in enumerate(zip(result.candidates, result.bands, strict=True), 1):
        s = c.shape
        cut = ",".join(map(str, c.pipeline.cut.counts))
        peaks = " ".join(f"{p / GIB:.2f}" for p in c.peak_bytes)
        low, high = (100 * (t / c.iteration_time_s - 1) for t in band.time_s)
        spread = f"{low:+.1f}..{high:+.1f}%"
        lines.append(f"{i:>2} {s.stages:>3} {s.replicas:>3} {s.micro_batch:>3} {s.microbatches:>4}  {cut:<18.18} "
                     f"{c.order:<16.16} {c.iteration_time_s * 1e3:>8.2f}ms {spread:>15} {band.regime:<12} "
                     f"{c.throughput():>10.1f} {c.energy_j:>10.1f} J {100 * c.saving:>6.1f}%  {peaks}")
    if result.undecided:
        measure = "energy" if result.objective.kind == "energy" else "time"
        lines.append(f"undecided: the {measure} bands of #{', #'.join(map(str, result.undecided))} overlap #1's: the "
                     "host's speed, not the prediction, decides between them (launch-bound configurations)")
    return "\n".join(lines)


def draw_frontier(result: SearchResult, path: str | Path) -> None:
    import matplotlib.pyplot as plt

    fig = frontier_figure(result)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)


def frontier_figure(result: SearchResult) -> Figure:
    """Every planned configuration as a point (iteration time, job energy per iteration), each chosen one (the
    top k, or the frontier) labelled with its rank and shape, the best one starred. Points, not a line:
    configurations are separate choices, not a curve to read values between."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    chosen = set(map(id, result.candidates))
    others = [c for c in result.planned if id(c) not in chosen]
    if others:
        ax.scatter([c.iteration_time_s for c in others], [c.energy_j for c in others], s=18, color="0.6",
                   label=f"other planned configurations ({len(others)})")
    kind = "frontier" if result.objective.kind == "frontier" else f"top {len(result.candidates)}"
    ax.scatter([c.iteration_time_s for c in result.candidates], [c.energy_j for c in result.candidates], s=36,
               color="tab:blue", label=f"{kind}, labelled #rank P D b M", zorder=3)
    for rank, c in enumerate(result.candidates, 1):
        s = c.shape
        ax.annotate(f"#{rank} P={s.stages} D={s.replicas} b={s.micro_batch} M={s.microbatches}",
                    (c.iteration_time_s, c.energy_j), xytext=(6, 4), textcoords="offset points", fontsize=7)
    best = result.candidates[0]
    ax.scatter([best.iteration_time_s], [best.energy_j], marker="*", s=200, color="tab:red", zorder=4,
               label=f"chosen: {best.shape.label()}")
    if result.time_budget_s is not None:
        ax.axvline(result.time_budget_s, ls="--", color="tab:orange", label="throughput floor")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration, all GPUs (J)")
    ax.set_title(f"envpipe search, objective {result.objective.kind}: {len(result.planned)} configurations planned "
                 "(simulated)", fontsize=10)
    ax.margins(0.15)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig

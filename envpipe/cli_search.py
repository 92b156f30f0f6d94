"""`envpipe search`: the pipeline configuration (stages, cut, replicas, micro-batches, order, clocks) for a
per-layer profile and a set of GPUs; writes the top k, the found configuration and its plan."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from envpipe.search.cluster import GIB, Cluster
from envpipe.search.layers import LayerProfileError, load_layer_profile
from envpipe.search.space import MAX_PLAN_UNITS, OBJECTIVES, SearchError

_PROGRESS_EVERY_S = 1.0


class _Progress:
    """Progress lines on stderr, at most one a second: quiet on quick searches, alive on long ones."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if now - self.last >= _PROGRESS_EVERY_S:
            self.last = now
            click.echo(f"search: {what} ({done}/{total}), {now - self.start:.0f} s", err=True)


@click.command("search")
@click.option("--layers", "layers_path", required=True, type=click.Path(dir_okay=False),
              help="layer profile JSON (examples/train_gpt.py --profile-layers)")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(min=1), required=True)
@click.option("--global-batch", type=click.IntRange(min=1), required=True, help="samples per iteration, all replicas")
@click.option("--memory-gib", type=click.FloatRange(min=0, min_open=True), required=True,
              help="memory per GPU the allocator's peak must fit in (leave room for the CUDA context)")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="throughput", show_default=True,
              help="highest throughput, least energy at a throughput floor, or the time-energy frontier")
@click.option("--min-throughput", type=float, default=None, help="energy: floor in samples/s")
@click.option("--max-slowdown", type=float, default=None,
              help="energy: floor as the fastest configuration's time x (1 + this), e.g. 0.05")
@click.option("--top-k", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--intra-node-gbps", type=click.FloatRange(min=0, min_open=True), default=100.0, show_default=True,
              help="GB/s between GPUs of one node (p2p and all-reduce bus bandwidth; assumed unless measured)")
@click.option("--inter-node-gbps", type=click.FloatRange(min=0, min_open=True), default=12.5, show_default=True,
              help="GB/s between nodes (assumed unless measured)")
@click.option("--allreduce-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="all-reduce bus bandwidth within a node in GB/s (default: --intra-node-gbps)")
@click.option("--latency-us", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="latency of one message (assumed unless measured)")
@click.option("--max-plan-units", type=click.IntRange(min=0), default=MAX_PLAN_UNITS, show_default=True,
              help="iterations with more forward/backward units keep their 1F1B all-max plan (the optimal planner "
              "takes seconds per configuration at tens of thousands of units); 0: no limit")
@click.option("--out-dir", type=click.Path(file_okay=False), default="found", show_default=True,
              help="where search.json, found.json, found.plan.json and frontier.png go")
@click.option("--launch-args", default="", help="backend options for the printed envpipe-launch command, "
              "e.g. \"--backend kube --image REGISTRY/envpipe-runtime:TAG\"")
def search_command(layers_path: str, nodes: int, gpus_per_node: int, global_batch: int, memory_gib: float,
                   objective: str, min_throughput: float | None, max_slowdown: float | None, top_k: int,
                   intra_node_gbps: float, inter_node_gbps: float, allreduce_gbps: float | None, latency_us: float,
                   max_plan_units: int, out_dir: str, launch_args: str) -> None:
    """Search stages, stage cut, replicas, micro-batch size and count, order and clocks (Aceso-style)."""
    # the search plans with the optimal planner (scipy): imported here, so that `envpipe --help` starts fast
    from envpipe.search.found import found_config, launch_command
    from envpipe.search.report import draw_frontier, result_json, table
    from envpipe.search.search import Objective, search

    cluster = Cluster(nodes, gpus_per_node, int(memory_gib * GIB), intra_node_gbps * 1e9, inter_node_gbps * 1e9,
                      latency_us * 1e-6, (allreduce_gbps or intra_node_gbps) * 1e9)
    try:
        layers = load_layer_profile(layers_path)
        result = search(layers, cluster, global_batch, Objective(objective, min_throughput, max_slowdown), top_k,
                        _Progress(), max_plan_units or None)
    except (LayerProfileError, SearchError) as exc:
        raise click.ClickException(str(exc)) from None
    stats = result.stats
    click.echo(f"{stats.shapes} configurations for {cluster.gpus} GPUs ({nodes} x {gpus_per_node}), global batch "
               f"{global_batch}: {stats.infeasible} do not fit {memory_gib:g} GiB, {stats.too_slow} miss the floor, "
               f"{stats.pruned} pruned, {stats.planned} planned"
               + (f" ({stats.not_planned} too large for the planner: 1F1B all-max)" if stats.not_planned else "")
               + f"; {stats.seconds:.2f} s")
    click.echo(f"predictions simulated on {layers_path} ({layers.device}, {layers.dtype}, {layers.date}):")
    click.echo(table(result))
    best = result.candidates[0]
    out = Path(out_dir)
    config = found_config(best, layers, cluster, "found.plan.json")
    try:
        (out / "top").mkdir(parents=True, exist_ok=True)
        best.plan.save(out / "found.plan.json")
        _write_json(out / "found.json", config)
        for rank, other in enumerate(result.candidates[1:], 2):  # the runners-up, to train or benchmark too
            other.plan.save(out / "top" / f"{rank}.plan.json")
            _write_json(out / "top" / f"{rank}.json", found_config(other, layers, cluster, f"{rank}.plan.json"))
        _write_json(out / "search.json", result_json(result, layers, cluster, global_batch))
        draw_frontier(result, out / "frontier.png")
    except OSError as exc:
        raise click.ClickException(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
    ds_block = {k: v for k, v in config.items() if k != "envpipe_search"}
    click.echo(f"chosen: #1 {best.shape.label()}, stage layers {list(best.pipeline.cut.counts)}, order {best.order}")
    click.echo("DeepSpeed config block (with the envpipe block):")
    click.echo(json.dumps(ds_block, indent=1))
    click.echo(f"written: {out / 'found.json'} (the config), {out / 'found.plan.json'} (the plan), "
               f"{out / 'search.json'} (top {len(result.candidates)}; runners-up's configs in {out / 'top'}), "
               f"{out / 'frontier.png'}")
    click.echo("train it:")
    click.echo("  " + launch_command(cluster, str(out / "found.json"), layers, launch_args))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: an interrupted write never leaves a corrupt file behind."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

"""`envpipe search`: the pipeline configuration (stages, cut, replicas, micro-batches, order, clocks) for a
per-layer profile and a set of GPUs; writes the top k, the found configuration and its plan.

Input goes through the same checks as `envpipe plan` (envpipe.limits, envpipe.cli_common.Finite): finite
numbers within documented bounds, the layer profile a regular file of bounded size. Output is written
whole or not at all: every file is made in a staging directory beside ``--out-dir`` and moved in at the end.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from envpipe.atomicfile import new_file_mode
from envpipe.cli_common import Finite, Slowdown
from envpipe.limits import MAX_UNITS, quote
from envpipe.search.cluster import GIB, Cluster
from envpipe.search.engine_model import EngineModelError, engine_model, load_engine_model
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import LayerProfile, LayerProfileError, load_layer_profile
from envpipe.search.space import MAX_PLAN_UNITS, OBJECTIVES, SearchError

_PROGRESS_EVERY_S = 1.0
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_GLOBAL_BATCH = 2**24
MAX_TOP_K = 1000
MAX_MEMORY_GIB = 2**20
MAX_COMMUNICATOR_MIB = 2**20
MIB = 1 << 20
MAX_LINK_GBPS = 1e6  # gigabits per second: 1 Pb/s
# 100 Mb/s: slower than any link a GPU job trains over; much lower ones made every time overflow the planner's
# (1e-300 Gb/s: InfeasibleBudget tracebacks)
MIN_LINK_GBPS = 0.1
MAX_LATENCY_US = 1e6
MAX_THROUGHPUT = 1e12  # samples per second
BITS = 8  # a link's gigabits per second are GBPS / 8 gigabytes per second


class _Progress:
    """Progress lines on stderr, at most one a second: quiet on quick searches, alive on long ones."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if now - self.last >= _PROGRESS_EVERY_S:
            self.last = now
            click.echo(f"search: {what} ({done}/{total}), {now - self.start:.0f} s", err=True)


def _gbps() -> Finite:
    return Finite(MIN_LINK_GBPS, MAX_LINK_GBPS)


def _shell_words(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Options for a shell command line: words a shell can split (checked before any work or file)."""
    try:
        shlex.split(value)
    except ValueError as exc:  # an unbalanced quote
        raise click.BadParameter(f"{quote(value)}: {exc}", ctx, param) from None
    return value


@click.command("search")
@click.option("--layers", "layers_path", required=True, type=click.Path(dir_okay=False),
              help="layer profile JSON (examples/train_gpt.py --profile-layers); a regular file of at most 16 MiB")
@click.option("--nodes", type=click.IntRange(1, MAX_NODES), default=1, show_default=True, help="nodes of GPUs")
@click.option("--gpus-per-node", type=click.IntRange(1, MAX_GPUS_PER_NODE), required=True,
              help="GPUs per node; the search uses all nodes x GPUs")
@click.option("--global-batch", type=click.IntRange(1, MAX_GLOBAL_BATCH), required=True,
              help="samples per iteration, all replicas")
@click.option("--memory-gib", type=Finite(0, MAX_MEMORY_GIB, low_open=True), default=None,
              help="memory per GPU in GiB (default: the device's, from a GPU layer profile; a CPU profile needs it)")
@click.option("--memory-margin-gib", type=Finite(0, MAX_MEMORY_GIB), default=1.0, show_default=True,
              help="safety margin in GiB: a configuration whose predicted device peak (tensors, allocator overhead, "
              "CUDA context, workspaces) is above the memory less this does not fit")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="throughput", show_default=True,
              help="highest throughput, least energy at a throughput floor, or the time-energy frontier")
@click.option("--min-throughput", type=Finite(0, MAX_THROUGHPUT, low_open=True), default=None,
              help="energy objective: the throughput floor in samples/s")
@click.option("--max-slowdown", type=Slowdown(), default=None,
              help="energy objective: the floor as the fastest configuration's iteration time x (1 + this), a "
              "fraction or a percent: 0.05 or 5%")
@click.option("--top-k", type=click.IntRange(1, MAX_TOP_K), default=5, show_default=True,
              help="configurations to plan and report (throughput and energy objectives)")
@click.option("--intra-node-gbps", type=_gbps(), default=800.0, show_default=True,
              help="gigabits per second between GPUs of one node, point to point (assumed unless measured: "
              "benchmarks/search_links.py); 800 Gb/s = 100 GB/s")
@click.option("--inter-node-gbps", type=_gbps(), default=100.0, show_default=True,
              help="gigabits per second between nodes (assumed unless measured); 100 Gb/s = 12.5 GB/s")
@click.option("--allreduce-gbps", type=_gbps(), default=None,
              help="all-reduce bus bandwidth within a node in gigabits per second (default: --intra-node-gbps)")
@click.option("--latency-us", type=Finite(0, MAX_LATENCY_US), default=20.0, show_default=True,
              help="latency of one message in microseconds (assumed unless measured)")
@click.option("--communicator-mib", type=Finite(0, MAX_COMMUNICATOR_MIB), default=0.0, show_default=True,
              help="device memory of one process group's NCCL communicator, outside the allocator (measured by "
              "benchmarks/search_comms.py; 0: not counted)")
@click.option("--max-plan-units", type=click.IntRange(0, MAX_UNITS), default=MAX_PLAN_UNITS, show_default=True,
              help="iterations with more forward/backward units keep their 1F1B all-max plan (the optimal planner "
              "takes seconds per configuration at tens of thousands of units); 0: up to the planner's limit")
@click.option("--engine-model", "engine_path", type=click.Path(dir_okay=False), default=None,
              help="what the pipeline engine adds to the layers' time and memory on your GPU hosts, fitted by "
              "benchmarks/search_fit.py (default: the fit committed with envpipe, measured on an H100)")
@click.option("--cuda-graphs", "graphed", is_flag=True,
              help="predict the units replayed as CUDA graphs (the found config sets the runtime's cuda_graphs): "
              "the layers' device times, not the host's launches, set their pace")
@click.option("--out-dir", type=click.Path(file_okay=False), default="found", show_default=True,
              help="where search.json, found.json, found.plan.json, top/ and frontier.png go")
@click.option("--launch-args", default="", callback=_shell_words,
              help="backend options for the printed envpipe-launch command, "
              "e.g. \"--backend kube --image REGISTRY/envpipe-runtime:TAG\"")
def search_command(layers_path: str, nodes: int, gpus_per_node: int, global_batch: int, memory_gib: float | None,
                   memory_margin_gib: float, objective: str, min_throughput: float | None, max_slowdown: float | None,
                   top_k: int, intra_node_gbps: float, inter_node_gbps: float, allreduce_gbps: float | None,
                   latency_us: float, communicator_mib: float, max_plan_units: int,
                   engine_path: str | None, graphed: bool, out_dir: str, launch_args: str) -> None:
    """Search stages, stage cut, replicas, micro-batch size and count, order and clocks (Aceso-style).

    Every prediction is simulated from the layer profile; the links are assumed unless given as measured."""
    # the search plans with the optimal planner (scipy): imported here, so that `envpipe --help` starts fast
    from envpipe.search.found import found_config, launch_command, with_band
    from envpipe.search.report import draw_frontier, result_json, table
    from envpipe.search.search import Objective, SearchOptions, search

    out = Path(out_dir)
    anchor = _writable_anchor(out)
    try:
        layers = load_layer_profile(layers_path)
        engine = load_engine_model(engine_path) if engine_path else engine_model(layers)
    except (LayerProfileError, EngineModelError) as exc:
        raise click.ClickException(str(exc)) from None
    if graphed and layers.device == "cpu":
        raise click.BadParameter(f"CUDA graphs need a CUDA device; {layers_path} was measured on the CPU",
                                 param_hint="'--cuda-graphs'")
    memory = _memory_bytes(memory_gib, layers)
    margin = round(memory_margin_gib * GIB)
    if margin >= memory:
        raise click.BadParameter(f"{memory_margin_gib:g} GiB is not below the memory per GPU, "
                                 f"{memory / GIB:.2f} GiB", param_hint="'--memory-margin-gib'")
    cluster = Cluster(nodes, gpus_per_node, memory, intra_node_gbps * 1e9 / BITS, inter_node_gbps * 1e9 / BITS,
                      latency_us * 1e-6, (allreduce_gbps or intra_node_gbps) * 1e9 / BITS, margin,
                      round(communicator_mib * MIB))
    click.echo(_assumptions(cluster, layers, memory_gib is None))
    click.echo(f"engine model: {engine.label}")
    try:
        result = search(SearchInputs(layers, cluster, engine, graphed), global_batch,
                        Objective(objective, min_throughput, max_slowdown),
                        SearchOptions(top_k, max_plan_units or MAX_UNITS, _Progress()))
    except SearchError as exc:
        raise click.ClickException(str(exc)) from None
    stats = result.stats
    click.echo(f"{stats.shapes} configurations for {cluster.gpus} GPUs ({nodes} x {gpus_per_node}), global batch "
               f"{global_batch}: {stats.infeasible} do not fit, {stats.too_slow} miss the floor, "
               f"{stats.pruned} pruned, {stats.planned} planned"
               + (f" ({stats.not_planned} too large for the planner: 1F1B all-max)" if stats.not_planned else "")
               + f"; {stats.seconds:.2f} s")
    click.echo(f"predictions simulated on {layers_path} ({layers.device}, {layers.dtype}, {layers.date}):")
    click.echo(table(result))
    best = result.candidates[0]
    config = with_band(found_config(best, layers, cluster, "found.plan.json", engine, graphed), result.bands[0])
    files: dict[str, Any] = {"found.plan.json": best.plan, "found.json": config,
                             "search.json": result_json(result, layers, cluster, global_batch)}
    for rank, (other, band) in enumerate(zip(result.candidates[1:], result.bands[1:], strict=True), 2):
        files[f"top/{rank}.plan.json"] = other.plan  # the runners-up, to train or benchmark too
        files[f"top/{rank}.json"] = with_band(found_config(other, layers, cluster, f"{rank}.plan.json", engine,
                                                                  graphed), band)
    _write_all(out, anchor, files, lambda path: draw_frontier(result, path))
    ds_block = {k: v for k, v in config.items() if k != "envpipe_search"}
    click.echo(f"chosen: #1 {best.shape.label()}, stage layers {list(best.pipeline.cut.counts)}, order {best.order}")
    click.echo("DeepSpeed config block (with the envpipe block):")
    click.echo(json.dumps(ds_block, indent=1))
    click.echo(f"written: {out / 'found.json'} (the config), {out / 'found.plan.json'} (the plan), "
               f"{out / 'search.json'} (top {len(result.candidates)}; runners-up's configs in {out / 'top'}), "
               f"{out / 'frontier.png'}")
    click.echo("train it:")
    click.echo("  " + launch_command(cluster, str(out / "found.json"), layers, engine, launch_args))


def _memory_bytes(memory_gib: float | None, layers: LayerProfile) -> int:
    if memory_gib is not None:
        return round(memory_gib * GIB)
    if layers.device_memory.total_bytes is None:
        raise click.UsageError(f"give --memory-gib: the layer profile {layers.source} does not know its device's "
                               "memory (measured on CPU, or a version 1 profile)")
    return layers.device_memory.total_bytes


def _assumptions(cluster: Cluster, layers: LayerProfile, memory_from_profile: bool) -> str:
    """One line: the memory and the links the search assumes (bandwidths in the units of the options)."""
    def gbps(bytes_per_s: float) -> str:
        return f"{bytes_per_s * BITS / 1e9:g} Gb/s ({bytes_per_s / 1e9:g} GB/s)"

    source = f"the device's, from {layers.source}" if memory_from_profile else "--memory-gib"
    return (f"assumed: {cluster.memory_bytes / GIB:.2f} GiB per GPU ({source}), margin "
            f"{cluster.margin_bytes / GIB:.2f} GiB; links: within a node {gbps(cluster.intra_node_bytes_per_s)} "
            f"point to point, all-reduce bus {gbps(cluster.allreduce_intra_bytes_per_s)}, between nodes "
            f"{gbps(cluster.inter_node_bytes_per_s)}, latency {cluster.latency_s * 1e6:g} us; a communicator "
            f"{cluster.communicator_bytes / MIB:g} MiB")


def _writable_anchor(out: Path) -> Path:
    """The nearest existing directory at or above ``out``'s parent, checked writable before any work (a search
    can take a minute: a place it cannot write to is one line at once, not after it)."""
    try:
        anchor = out.absolute().parent
        while not anchor.exists():
            anchor = anchor.parent
        usable = anchor.is_dir() and os.access(anchor, os.W_OK | os.X_OK)
        if out.exists():
            usable = usable and out.is_dir() and os.access(out, os.W_OK | os.X_OK)
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        raise click.BadParameter(f"not a usable directory name: {exc}", param_hint="'--out-dir'") from None
    if not usable:
        raise click.BadParameter(f"cannot write in {out if out.exists() else anchor}", param_hint="'--out-dir'")
    return anchor


def _write_all(out: Path, anchor: Path, files: dict[str, Any], picture: Any) -> None:
    """Every file (a Plan, or JSON data) and the frontier picture into ``out``, or none of them: staged in a
    directory beside it first. JSON is strict: a NaN or Infinity is never written."""
    try:
        stage = Path(tempfile.mkdtemp(dir=anchor, prefix=".envpipe-search."))
    except OSError as exc:
        raise click.ClickException(f"cannot write to {out}: {exc.strerror or exc}") from None
    try:
        (stage / "top").mkdir()
        for name, data in files.items():
            if isinstance(data, dict):
                (stage / name).write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
            else:
                data.save(stage / name)
        picture(stage / "frontier.png")
        (out / "top").mkdir(parents=True, exist_ok=True)
        for path in sorted(stage.rglob("*")):
            if path.is_file():
                os.chmod(path, new_file_mode())
                os.replace(path, out / path.relative_to(stage))
    except OSError as exc:
        raise click.ClickException(f"cannot write to {out}: {exc.strerror or exc}") from None
    except ValueError as exc:  # json's allow_nan=False: a prediction that is not a finite number
        raise click.ClickException(f"not written: a prediction is not a finite number ({exc})") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)

"""`envpipe` command line: plan and simulate pipeline clock plans."""

from __future__ import annotations

from dataclasses import replace

import click
import numpy as np

from envpipe.cli_common import Finite, OneLineErrors, output_option, show, write_outputs
from envpipe.cli_optimal import OptimalArgs, optimal_options, run_optimal
from envpipe.cli_search import search_command
from envpipe.limits import (
    MAX_MICROBATCHES,
    MAX_POWER_W,
    MAX_SECONDS,
    MAX_STAGES,
    MAX_THRESHOLD_SCALE,
    quote,
    range_error,
    units_error,
)
from envpipe.plan.dag import ScheduleError
from envpipe.plan.memory import StageMemory, describe_peaks, parse_bytes
from envpipe.plan.planfile import Plan, PlanError, baseline_timeline, evaluate_plan, unit_clocks
from envpipe.plan.planner import make_plan
from envpipe.plan.policies import POLICIES
from envpipe.plan.reconfig import RECONFIGS
from envpipe.plan.schedules import CHUNKED, SCHEDULES
from envpipe.profile import Profile, ProfileError, load_profile
from envpipe.profile.gpus import GPU_NAMES, IDLE_POWER_W

_USER_ERRORS = (ProfileError, PlanError, ScheduleError, ValueError, KeyError)


def _load(profile_path: str, stages: int | None, microbatches: int, tail_time: float | np.ndarray,
          chunk_rows: int | None = None) -> tuple[Profile, str | None]:
    """The profile, cut or tiled to ``stages``, and the note that says so (shown once planning worked);
    the pipeline's size and the number of tail times checked against it. A profile with ``chunk_rows`` rows
    (one per model chunk of interleaved 1F1B or DualPipeV) is kept as it is."""
    try:
        profile = load_profile(profile_path)
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    note = None
    if chunk_rows is not None and profile.num_stages == chunk_rows:
        too_big = units_error(profile.num_stages, microbatches)
        if too_big:
            raise click.ClickException(too_big)
        return profile, None
    if stages is not None and stages != profile.num_stages:
        note = (f"note: --stages {stages}: the profile has {profile.num_stages} measured stages; "
                "stages are cut or repeated cyclically (a what-if, not a measurement)")
        profile = profile.with_stages(stages)
    too_big = units_error(profile.num_stages, microbatches)
    if too_big:
        raise click.ClickException(too_big)
    if isinstance(tail_time, np.ndarray) and tail_time.size != profile.num_stages:
        raise click.BadParameter(f"{tail_time.size} tail times given for {profile.num_stages} stages "
                                 "(give one, or one per stage)", param_hint="--tail-time")
    return profile, note


def _idle_power(idle_power: float | None, gpu: str) -> float:
    if idle_power is not None:
        return idle_power
    if gpu in IDLE_POWER_W:
        return IDLE_POWER_W[gpu]
    raise click.UsageError(f"give --idle-power WATTS (no measured blocking power is known for --gpu {gpu}; "
                           f"known: {', '.join(f'{k} {v} W' for k, v in IDLE_POWER_W.items())})")


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="envpipe")
def main() -> None:
    """EnvPipe: plan and simulate energy-saving clocks for pipeline-parallel training.

    All numbers are simulated from the profile; limits on every input are in docs/planner.md.
    """


main.add_command(search_command)


profile_option = click.option("--profile", "profile_path", required=True, type=click.Path(dir_okay=False),
                              help="stage profile CSV (stage,instruction,frequency,time,energy)")
stages_option = click.option("--stages", type=click.IntRange(1, MAX_STAGES), default=None,
                             help="pipeline stages (default: the profile's; others cut or repeat its stages)")
idle_option = click.option("--idle-power", type=Finite(0, MAX_POWER_W), default=None,
                           help="blocking (idle) power per GPU in W (default: the measured value for --gpu)")
transfer_option = click.option("--transfer-time", type=Finite(0, MAX_SECONDS), default=0.0, show_default=True,
                               help="seconds to send one activation or gradient between stages")
text_option = click.option("--text", is_flag=True, help="print EnvPipe's text trace (clock and wait of every unit)")
gantt_option = output_option("--gantt", suffixes=(".png", ".svg"),
                             help="write a Gantt picture here (.png or .svg; missing directories are created)")


def _tail_times(ctx: click.Context, param: click.Parameter, value: str) -> float | np.ndarray:
    """One tail time for every stage (a float), or one per stage (an array)."""
    parts = value.split(",")
    if len(parts) > MAX_STAGES:
        raise click.BadParameter(f"{len(parts)} tail times; at most one per stage ({MAX_STAGES})")
    try:
        times = [float(v) for v in parts]
    except ValueError:
        raise click.BadParameter(f"{quote(value)}: expected seconds, e.g. 0.02 or 0.02,0.03") from None
    reasons = [r for r in (range_error(t, 0, MAX_SECONDS) for t in times) if r]
    if reasons:
        raise click.BadParameter(f"tail times {reasons[0]}")
    return times[0] if len(times) == 1 else np.array(times)


def _byte_amounts(ctx: click.Context, param: click.Parameter, value: str | None) -> int | list[int] | None:
    """One amount of bytes for every stage (an int), or one per stage (a list)."""
    if value is None:
        return None
    try:
        amounts = [parse_bytes(v) for v in value.split(",")]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return amounts[0] if len(amounts) == 1 else amounts


def _stage_memory(num_stages: int, activation: int | list[int] | None, available: int | list[int] | None
                  ) -> StageMemory | None:
    if activation is None and available is None:
        return None
    if activation is None or available is None:
        raise click.UsageError("--activation-bytes and --memory-available go together (bytes per in-flight "
                               "micro-batch, and bytes a stage has for them)")
    try:
        return StageMemory.per_stage(num_stages, activation, available)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


tail_option = click.option(
    "--tail-time", default="0", show_default=True, callback=_tail_times,
    help="seconds each stage works after its last unit (gradient all-reduce, optimizer step): "
         "one number, or one per stage separated by commas")


@main.command()
@profile_option
@click.option("--microbatches", "-m", type=click.IntRange(1, MAX_MICROBATCHES), required=True,
              help="micro-batches per iteration")
@stages_option
@click.option("--schedule", type=click.Choice(SCHEDULES), default="envpipe", show_default=True,
              help="unit order: DeepSpeed's 1F1B, EnvPipe's (extra warm-up forwards), GPipe, interleaved "
                   "(Megatron's, --chunks per stage) or dualpipev (DeepSpeed's DualPipeVSchedule, 2 chunks per "
                   "stage); the last two take --policy baseline or optimal")
@click.option("--chunks", type=click.IntRange(2, MAX_STAGES), default=None,
              help="model chunks per stage of --schedule interleaved (default 2). A profile with --stages x "
                   "chunks rows is one row per model chunk; one with a row per stage is split evenly")
@click.option("--policy", type=click.Choice((*POLICIES, "optimal")), default="envelope", show_default=True,
              help="EnvPipe's policies, or 'optimal' (least energy within a time budget, see docs/optimal-planner.md)")
@click.option("--reconfig", type=click.Choice(RECONFIGS), default="balanced", show_default=True,
              help="EnvPipe's reconfiguration of critical-path clocks (not used by --policy optimal)")
@idle_option
@click.option("--gpu", type=click.Choice(GPU_NAMES, case_sensitive=False), default="all", show_default=True,
              help="candidate-clock filter (EnvPipe's per-GPU rule; 'all' = every clock in the profile)")
@transfer_option
@tail_option
@click.option("--activation-bytes", callback=_byte_amounts, default=None,
              help="bytes of activations one in-flight micro-batch keeps on a stage until its backward "
                   "(e.g. 1.5GiB; SI and binary suffixes): one number, or one per stage separated by commas")
@click.option("--memory-available", callback=_byte_amounts, default=None,
              help="bytes a stage has for in-flight activations: the GPU memory limit minus weights, gradients, "
                   "optimizer state and workspace; one number or one per stage. Orders that do not fit are not "
                   "used (EnvPipe's extra warm-up forwards are capped), and the plan reports each stage's peak")
@click.option("--threshold-scale", type=Finite(0, MAX_THRESHOLD_SCALE, low_open=True), default=4.0,
              show_default=True, help="reconfiguration threshold = scale x smallest last-stage recv stall")
@output_option("--out", help="write the plan JSON here (missing directories are created)")
@text_option
@gantt_option
@optimal_options
def plan(profile_path: str, microbatches: int, stages: int | None, schedule: str, chunks: int | None, policy: str,
         reconfig: str, idle_power: float | None, gpu: str, transfer_time: float, tail_time: float | np.ndarray,
         activation_bytes: int | list[int] | None, memory_available: int | list[int] | None,
         threshold_scale: float, out: str | None, text: bool, gantt: str | None,
         max_slowdown: float | None, time_budget: float | None, frontier_csv: str | None,
         frontier_points: int) -> None:
    """Plan clocks for one iteration and show the predicted time and energy."""
    gpu = gpu.lower()
    watts = _idle_power(idle_power, gpu)
    if policy != "optimal" and (max_slowdown, time_budget, frontier_csv) != (None, None, None):
        raise click.UsageError("--max-slowdown, --time-budget and --frontier need --policy optimal")
    if chunks is not None and schedule != "interleaved":
        raise click.UsageError("--chunks applies to --schedule interleaved")
    chunk_rows = stages * (chunks or CHUNKED[schedule]) if schedule in CHUNKED and stages is not None else None
    profile, note = _load(profile_path, stages, microbatches, tail_time, chunk_rows)
    pipeline = stages if stages is not None else profile.num_stages
    memory = _stage_memory(pipeline, activation_bytes, memory_available)
    if policy == "optimal":
        run_optimal(profile, microbatches, schedule, watts, transfer_time, memory,
                    OptimalArgs(max_slowdown, time_budget, frontier_csv, frontier_points, out, text, gantt), tail_time,
                    note, chunks=chunks, stages=pipeline)
        return
    try:
        result = make_plan(profile, microbatches, schedule=schedule, policy=policy,
                           reconfig=reconfig, idle_power_w=watts, gpu=gpu, transfer_s=transfer_time,
                           memory=memory, threshold_scale=threshold_scale, tail_s=tail_time, chunks=chunks,
                           stages=pipeline)
    except _USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from None
    if note:
        click.echo(note, err=True)
    p = replace(result.plan, profile_digest=profile.digest)
    click.echo(f"schedule {schedule}, policy {p.policy}, {p.num_stages} stages x {microbatches} micro-batches, "
               f"idle power {watts} W")
    click.echo(f"candidate clocks: {result.candidates[0]}..{result.candidates[-1]} MHz ({len(result.candidates)}); "
               f"valley clock per stage: {result.valley_mhz}; extra warm-up forwards r_s: {result.reschedule}")
    if result.reconfig.rounds:
        click.echo(f"reconfiguration: {result.reconfig.raises} raises in {result.reconfig.rounds} rounds "
                   f"({result.reconfig.stop_reason})")
    if p.peak_memory_bytes is not None:
        click.echo(describe_peaks(p.peak_memory_bytes))
    show(result.timeline, result.baseline, result.reconfig.freqs_mhz, "simulated on the measured profile:", text)
    write_outputs(p, out, result.timeline, result.reconfig.freqs_mhz, gantt,
                  f"{schedule} / {p.policy}: {p.num_stages} stages x {microbatches} micro-batches (simulated)")


@main.command()
@profile_option
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False),
              help="plan JSON (from `envpipe plan --out`, or written by hand)")
@stages_option
@idle_option
@click.option("--gpu", type=click.Choice(GPU_NAMES, case_sensitive=False), default="all", show_default=True,
              help="only used to pick a default --idle-power")
@transfer_option
@tail_option
@text_option
@gantt_option
def simulate(profile_path: str, plan_path: str, stages: int | None, idle_power: float | None, gpu: str,
             transfer_time: float, tail_time: float | np.ndarray, text: bool, gantt: str | None) -> None:
    """Recompute iteration time and energy of any plan (also one written by hand)."""
    watts = _idle_power(idle_power, gpu.lower())
    try:
        plan_obj = Plan.load(plan_path)
    except PlanError as exc:
        raise click.ClickException(str(exc)) from None
    chunk_rows = plan_obj.num_stages * plan_obj.chunks if plan_obj.chunks > 1 else None
    profile, note = _load(profile_path, stages, plan_obj.num_microbatches, tail_time, chunk_rows)
    try:
        plan_obj.check_profile(profile)
        tl = evaluate_plan(plan_obj, profile, watts, transfer_time, tail_time)
        base = baseline_timeline(profile, plan_obj.num_microbatches, watts, transfer_time, tail_time,
                                 plan_obj.layout())
    except _USER_ERRORS as exc:
        raise click.ClickException(f"{plan_path}: {exc}") from None
    if note:
        click.echo(note, err=True)
    clocks = unit_clocks(plan_obj, tl.dag)
    show(tl, base, clocks, f"{plan_path} simulated on {profile_path}:", text)
    claimed = plan_obj.predicted.get("iteration_time_s")
    if claimed is not None and abs(claimed - tl.iteration_time) > 1e-9 * max(1.0, claimed):
        click.echo(f"note: the plan claims {claimed:.4f} s; the simulation gives {tl.iteration_time:.4f} s", err=True)
    write_outputs(None, None, tl, clocks, gantt, f"{plan_path} (simulated)")

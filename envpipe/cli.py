"""`envpipe` command line: plan and simulate pipeline clock plans."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from envpipe.cli_optimal import OptimalArgs, optimal_options, run_optimal
from envpipe.plan.dag import ScheduleError
from envpipe.plan.gantt import draw_gantt
from envpipe.plan.memory import StageMemory, describe_peaks, parse_bytes
from envpipe.plan.planfile import Plan, PlanError, baseline_timeline, evaluate_plan
from envpipe.plan.planner import make_plan
from envpipe.plan.policies import POLICIES
from envpipe.plan.reconfig import RECONFIGS
from envpipe.plan.render import summary_table, text_trace
from envpipe.plan.schedules import CHUNKED, SCHEDULES
from envpipe.profile import Profile, ProfileError, load_profile
from envpipe.profile.gpus import GPU_NAMES, IDLE_POWER_W

_USER_ERRORS = (ProfileError, PlanError, ScheduleError, ValueError, KeyError)


def _load_or_fail(profile_path: str, stages: int | None) -> Profile:
    try:
        return _load(profile_path, stages)
    except _USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from None


def _load(profile_path: str, stages: int | None) -> Profile:
    return _staged(load_profile(profile_path), stages)


def _staged(profile: Profile, stages: int | None) -> Profile:
    if stages is not None and stages != profile.num_stages:
        click.echo(f"note: --stages {stages}: the profile has {profile.num_stages} measured stages; "
                   "stages are cut or repeated cyclically (a what-if, not a measurement)", err=True)
        profile = profile.with_stages(stages)
    return profile


def _idle_power(idle_power: float | None, gpu: str) -> float:
    if idle_power is not None:
        if idle_power < 0:
            raise click.BadParameter("must not be negative", param_hint="--idle-power")
        return idle_power
    if gpu in IDLE_POWER_W:
        return IDLE_POWER_W[gpu]
    raise click.UsageError(f"give --idle-power WATTS (no measured blocking power is known for --gpu {gpu}; "
                           f"known: {', '.join(f'{k} {v} W' for k, v in IDLE_POWER_W.items())})")


def _freqs_of(plan: Plan, tl_dag_order: tuple[tuple[int, ...], ...], n: int) -> np.ndarray:
    freqs = np.empty(n, int)
    for ids, units in zip(tl_dag_order, plan.stages, strict=True):
        for i, u in zip(ids, units, strict=True):
            freqs[i] = u.freq_mhz
    return freqs


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="envpipe")
def main() -> None:
    """EnvPipe: plan and simulate energy-saving clocks for pipeline-parallel training."""


profile_option = click.option("--profile", "profile_path", required=True, type=click.Path(dir_okay=False),
                              help="stage profile CSV (stage,instruction,frequency,time,energy)")
stages_option = click.option("--stages", type=click.IntRange(min=1), default=None,
                             help="pipeline stages (default: the profile's)")
idle_option = click.option("--idle-power", type=float, default=None,
                           help="blocking (idle) power per GPU in W (default: measured value for --gpu)")
transfer_option = click.option("--transfer-time", type=click.FloatRange(min=0), default=0.0, show_default=True,
                               help="seconds to send one activation or gradient between stages")


def _tail_times(ctx: click.Context, param: click.Parameter, value: str) -> float | np.ndarray:
    """One tail time for every stage (a float), or one per stage (an array)."""
    try:
        times = [float(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected seconds, e.g. 0.02 or 0.02,0.03") from None
    if any(not np.isfinite(t) or t < 0 for t in times):
        raise click.BadParameter(f"{value!r}: tail times must be finite and not negative")
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


memory_options = [
    click.option("--activation-bytes", callback=_byte_amounts, default=None,
                 help="bytes of activations one in-flight micro-batch keeps on a stage until its backward "
                      "(e.g. 1.5GiB; SI and binary suffixes): one number, or one per stage separated by commas"),
    click.option("--memory-available", callback=_byte_amounts, default=None,
                 help="bytes a stage has for in-flight activations: the GPU memory limit minus weights, "
                      "gradients, optimizer state and workspace; one number or one per stage. Orders that do "
                      "not fit are not used (EnvPipe's extra warm-up forwards are capped), and the plan "
                      "reports each stage's peak"),
]

tail_option = click.option(
    "--tail-time", default="0", show_default=True, callback=_tail_times,
    help="seconds each stage works after its last unit (gradient all-reduce, optimizer step): "
         "one number, or one per stage separated by commas")


@main.command()
@profile_option
@click.option("--microbatches", "-m", type=click.IntRange(min=1), required=True, help="micro-batches per iteration")
@stages_option
@click.option("--schedule", type=click.Choice(SCHEDULES), default="envpipe", show_default=True,
              help="unit order; interleaved (Megatron's, --chunks per stage) and dualpipev (DeepSpeed's "
                   "DualPipeVSchedule, 2 chunks per stage) take --policy baseline or optimal")
@click.option("--chunks", type=click.IntRange(min=2), default=None,
              help="model chunks per stage of --schedule interleaved (default 2). A profile with --stages x "
                   "chunks rows is one row per model chunk; one with a row per stage is split evenly")
@click.option("--policy", type=click.Choice((*POLICIES, "optimal")), default="envelope", show_default=True,
              help="EnvPipe's policies, or 'optimal' (least energy within a time budget, see docs/optimal-planner.md)")
@click.option("--reconfig", type=click.Choice(RECONFIGS), default="balanced", show_default=True)
@idle_option
@click.option("--gpu", type=click.Choice(GPU_NAMES, case_sensitive=False), default="all", show_default=True,
              help="candidate-clock filter (EnvPipe's per-GPU rule; 'all' = every clock in the profile)")
@transfer_option
@tail_option
@memory_options[0]
@memory_options[1]
@click.option("--threshold-scale", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
              help="reconfiguration threshold = scale x smallest last-stage recv stall")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="write the plan JSON here")
@click.option("--text", is_flag=True, help="print EnvPipe's text trace")
@click.option("--gantt", type=click.Path(dir_okay=False), default=None, help="write a Gantt picture (.png/.svg)")
@optimal_options
def plan(profile_path: str, microbatches: int, stages: int | None, schedule: str, chunks: int | None, policy: str,
         reconfig: str,
         idle_power: float | None, gpu: str, transfer_time: float, tail_time: float | np.ndarray,
         activation_bytes: int | list[int] | None, memory_available: int | list[int] | None,
         threshold_scale: float, out: str | None, text: bool, gantt: str | None,
         max_slowdown: float | None, time_budget: float | None, frontier_csv: str | None,
         frontier_points: int) -> None:
    """Plan clocks for one iteration and show the predicted time and energy."""
    gpu = gpu.lower()
    watts = _idle_power(idle_power, gpu)
    if gantt and Path(gantt).suffix.lower() not in (".png", ".svg"):
        raise click.BadParameter("must end in .png or .svg", param_hint="--gantt")
    if chunks is not None and schedule != "interleaved":
        raise click.UsageError("--chunks applies to --schedule interleaved")
    profile = _load_or_fail(profile_path, None)
    pipeline = profile.num_stages if stages is None else stages
    per_chunk = schedule in CHUNKED and profile.num_stages == pipeline * (chunks or CHUNKED[schedule])
    if not per_chunk:  # one row per pipeline stage: cut or tiled to --stages
        profile = _staged(profile, stages)
    memory = _stage_memory(pipeline, activation_bytes, memory_available)
    if policy == "optimal":
        run_optimal(profile, microbatches, schedule, watts, transfer_time, memory,
                    OptimalArgs(max_slowdown, time_budget, frontier_csv, frontier_points, out, text, gantt), tail_time,
                    chunks=chunks, stages=pipeline)
        return
    if (max_slowdown, time_budget, frontier_csv) != (None, None, None):
        raise click.UsageError("--max-slowdown, --time-budget and --frontier need --policy optimal")
    try:
        result = make_plan(profile, microbatches, schedule=schedule, policy=policy,
                           reconfig=reconfig, idle_power_w=watts, gpu=gpu, transfer_s=transfer_time,
                           memory=memory, threshold_scale=threshold_scale, tail_s=tail_time, chunks=chunks,
                           stages=pipeline)
    except _USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from None
    p = result.plan
    click.echo(f"schedule {schedule}, policy {p.policy}, {p.num_stages} stages x {microbatches} micro-batches, "
               f"idle power {watts} W")
    click.echo(f"candidate clocks: {result.candidates[0]}..{result.candidates[-1]} MHz ({len(result.candidates)}); "
               f"valley clock per stage: {result.valley_mhz}; extra warm-up forwards r_s: {result.reschedule}")
    if result.reconfig.rounds:
        click.echo(f"reconfiguration: {result.reconfig.raises} raises in {result.reconfig.rounds} rounds "
                   f"({result.reconfig.stop_reason})")
    if text:
        click.echo(text_trace(result.timeline, result.reconfig.freqs_mhz))
    if p.peak_memory_bytes is not None:
        click.echo(describe_peaks(p.peak_memory_bytes))
    click.echo(summary_table(result.timeline, result.baseline, "simulated on the measured profile:"))
    if out:
        p.save(out)
        click.echo(f"plan written to {out}")
    if gantt:
        draw_gantt(result.timeline, result.reconfig.freqs_mhz, gantt,
                   f"{schedule} / {p.policy}: {p.num_stages} stages x {microbatches} micro-batches (simulated)")
        click.echo(f"Gantt picture written to {gantt}")


@main.command()
@profile_option
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False), help="plan JSON")
@stages_option
@idle_option
@click.option("--gpu", type=click.Choice(GPU_NAMES, case_sensitive=False), default="all", show_default=True,
              help="only used to pick a default --idle-power")
@transfer_option
@tail_option
@click.option("--text", is_flag=True, help="print EnvPipe's text trace")
@click.option("--gantt", type=click.Path(dir_okay=False), default=None, help="write a Gantt picture (.png/.svg)")
def simulate(profile_path: str, plan_path: str, stages: int | None, idle_power: float | None, gpu: str,
             transfer_time: float, tail_time: float | np.ndarray, text: bool, gantt: str | None) -> None:
    """Recompute iteration time and energy of any plan (also one written by hand)."""
    watts = _idle_power(idle_power, gpu.lower())
    try:
        plan_obj = Plan.load(plan_path)
        profile = load_profile(profile_path)
        if profile.num_stages != plan_obj.num_stages * plan_obj.chunks:  # else: one row per model chunk
            profile = _staged(profile, stages)
        tl = evaluate_plan(plan_obj, profile, watts, transfer_time, tail_time)
        base = baseline_timeline(profile, plan_obj.num_microbatches, watts, transfer_time, tail_time, plan_obj.layout())
    except _USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from None
    freqs = _freqs_of(plan_obj, tl.dag.order, tl.dag.num_units)
    if text:
        click.echo(text_trace(tl, freqs))
    click.echo(summary_table(tl, base, f"{plan_path} simulated on {profile_path}:"))
    claimed = plan_obj.predicted.get("iteration_time_s")
    if claimed is not None and abs(claimed - tl.iteration_time) > 1e-9 * max(1.0, claimed):
        click.echo(f"note: the plan claims {claimed:.4f} s; the simulation gives {tl.iteration_time:.4f} s", err=True)
    if gantt:
        draw_gantt(tl, freqs, gantt, f"{plan_path} (simulated)")
        click.echo(f"Gantt picture written to {gantt}")

"""`envpipe` command line: plan and simulate pipeline clock plans."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import click
import numpy as np

from envpipe.cli_common import (
    Finite,
    OneLineErrors,
    Outputs,
    PerStage,
    PlanOptions,
    Shown,
    output_option,
    per_stage_count,
    powers,
    show,
    write_outputs,
)
from envpipe.cli_optimal import optimal_options, run_optimal
from envpipe.cli_search import search_command
from envpipe.limits import MAX_MICROBATCHES, MAX_POWER_W, MAX_SECONDS, MAX_STAGES, MAX_THRESHOLD_SCALE, units_error
from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import ScheduleError
from envpipe.plan.evaluate import baseline_name, baseline_timeline, evaluate_plan, unit_clocks
from envpipe.plan.layout import StageLayout
from envpipe.plan.memory import StageMemory, describe_peaks, parse_bytes
from envpipe.plan.planfile import Plan, PlanError
from envpipe.plan.planner import make_plan
from envpipe.plan.policies import POLICIES
from envpipe.plan.reconfig import RECONFIGS, Reconfig
from envpipe.plan.render import order_name
from envpipe.plan.schedules import CHUNKED, SCHEDULES, schedule_layout
from envpipe.plan.simulate import Overheads
from envpipe.profile import Profile, ProfileError, load_profile
from envpipe.profile.gpus import GPU_NAMES, IDLE_POWER_W

_USER_ERRORS = (ProfileError, PlanError, ScheduleError, ValueError, KeyError)


@dataclass(frozen=True)
class CaseOptions:
    """What the options of `plan` and `simulate` say about the pipeline (powers, times, memory): the case."""

    blocking_power: float | np.ndarray | None
    tail_power: float | np.ndarray | None
    gpu: str
    transfer_time: float
    tail_time: float | np.ndarray
    activation_bytes: int | list[int] | None = None
    memory_available: int | list[int] | None = None

    @classmethod
    def of(cls, options: dict[str, Any]) -> CaseOptions:
        names = ("blocking_power", "tail_power", "gpu", "transfer_time", "tail_time", "activation_bytes",
                 "memory_available")
        return cls(**{k: options[k] for k in names if k in options})

    def case(self, profile: Profile, num_microbatches: int, layout: StageLayout) -> PipelineCase:
        """The planning case of ``profile`` on ``layout``; usage errors name the option that does not fit."""
        S = layout.num_stages
        per_stage_count(self.tail_time, S, "tail times", "--tail-time")
        per_stage_count(self.blocking_power, S, "blocking powers", "--blocking-power")
        per_stage_count(self.tail_power, S, "tail powers", "--tail-power")
        overheads = Overheads.broadcast(S, self.blocking_power_w(), self.transfer_time, self.tail_time,
                                        self.tail_power)
        return PipelineCase(profile, num_microbatches, overheads, self.memory(S), layout)

    def blocking_power_w(self) -> float | np.ndarray:
        if self.blocking_power is not None:
            return self.blocking_power
        if self.gpu in IDLE_POWER_W:
            return IDLE_POWER_W[self.gpu]
        raise click.UsageError(f"give --blocking-power WATTS (no measured blocking power is known for --gpu "
                               f"{self.gpu}; known: {', '.join(f'{k} {v} W' for k, v in IDLE_POWER_W.items())})")

    def memory(self, num_stages: int) -> StageMemory | None:
        activation, available = self.activation_bytes, self.memory_available
        if activation is None and available is None:
            return None
        if activation is None or available is None:
            raise click.UsageError("--activation-bytes and --memory-available go together (bytes per in-flight "
                                   "micro-batch, and bytes a stage has for them)")
        try:
            return StageMemory.per_stage(num_stages, activation, available)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None


def _load(profile_path: str, stages: int | None, microbatches: int, chunk_rows: int | None = None
          ) -> tuple[Profile, str | None]:
    """The profile, cut or tiled to ``stages``, and the note that says so (shown once planning worked); the
    pipeline's size checked against it. A profile with ``chunk_rows`` rows (one per model chunk of interleaved
    1F1B or DualPipeV) is kept as it is."""
    try:
        profile = load_profile(profile_path)
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    note = None
    if not (chunk_rows is not None and profile.num_stages == chunk_rows) and stages not in (None, profile.num_stages):
        note = (f"note: --stages {stages}: the profile has {profile.num_stages} measured stages; "
                "stages are cut or repeated cyclically (a what-if, not a measurement)")
        profile = profile.with_stages(stages)
    too_big = units_error(profile.num_stages, microbatches)
    if too_big:
        raise click.ClickException(too_big)
    return profile, note


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
blocking_option = click.option(
    "--blocking-power", "--idle-power", "blocking_power", type=PerStage("blocking powers", 0, MAX_POWER_W, "watts"),
    default=None, help="power of a GPU while it waits in a bubble or a blocking receive, in W: one number, or one "
                       "per stage separated by commas (default: the measured value for --gpu)")
tail_power_option = click.option(
    "--tail-power", type=PerStage("tail powers", 0, MAX_POWER_W, "watts"), default=None,
    help="power of a GPU during its tail (--tail-time), in W: one number or one per stage (default: the "
         "blocking power)")
transfer_option = click.option("--transfer-time", type=Finite(0, MAX_SECONDS), default=0.0, show_default=True,
                               help="seconds to send one activation or gradient between stages")
tail_option = click.option(
    "--tail-time", type=PerStage("tail times", 0, MAX_SECONDS, "seconds"), default=0.0, show_default=True,
    help="seconds each stage works after its last unit (gradient all-reduce, optimizer step): "
         "one number, or one per stage separated by commas")
text_option = click.option("--text", is_flag=True,
                           help="print EnvPipe's text trace (clock and wait of every unit, with a legend)")
gantt_option = output_option("--gantt", suffixes=(".png", ".svg"),
                             help="write a Gantt picture here (.png or .svg; missing directories are created)")


def _byte_amounts(ctx: click.Context, param: click.Parameter, value: str | None) -> int | list[int] | None:
    """One amount of bytes for every stage (an int), or one per stage (a list)."""
    if value is None:
        return None
    try:
        amounts = [parse_bytes(v) for v in value.split(",")]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return amounts[0] if len(amounts) == 1 else amounts


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
@click.option("--policy", type=click.Choice((*POLICIES, "optimal")), default="optimal", show_default=True,
              help="'optimal' (least energy within a time budget, see docs/optimal-planner.md), or EnvPipe's "
                   "policies (they plan for no slowdown without guaranteeing it; a slower plan is warned about)")
@click.option("--reconfig", type=click.Choice(RECONFIGS), default="balanced", show_default=True,
              help="EnvPipe's reconfiguration of critical-path clocks (not used by --policy optimal)")
@blocking_option
@tail_power_option
@click.option("--gpu", type=click.Choice(GPU_NAMES, case_sensitive=False), default="all", show_default=True,
              help="candidate-clock filter of EnvPipe's policies (EnvPipe's per-GPU rule; 'all' = every clock in the "
                   "profile), and the default --blocking-power")
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
def plan(**options: Any) -> None:
    """Plan clocks for one iteration and show the predicted time and energy."""
    o = PlanOptions(**options)
    given = replace(CaseOptions.of(options), gpu=o.gpu.lower())
    given.blocking_power_w()  # a missing power is a usage error before any work
    if o.policy != "optimal" and (o.max_slowdown, o.time_budget, o.time_limit, o.frontier_csv) != (None,) * 4:
        raise click.UsageError("--max-slowdown, --time-budget, --time-limit and --frontier need --policy optimal")
    if o.chunks is not None and o.schedule != "interleaved":
        raise click.UsageError("--chunks applies to --schedule interleaved")
    chunk_rows = o.stages * (o.chunks or CHUNKED[o.schedule]) if o.schedule in CHUNKED and o.stages else None
    profile, note = _load(o.profile_path, o.stages, o.microbatches, chunk_rows)
    pipeline = o.stages if o.stages is not None else profile.num_stages
    try:
        layout = schedule_layout(o.schedule, pipeline, o.chunks)
        case = given.case(profile, o.microbatches, layout)
    except _USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from None
    if o.policy == "optimal":
        run_optimal(case, o, note)
        return
    try:
        result = make_plan(case, o.schedule, o.policy, Reconfig(o.reconfig, o.threshold_scale), given.gpu)
    except _USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from None
    if note:
        click.echo(note, err=True)
    p = replace(result.plan, profile_digest=profile.digest)
    click.echo(f"{order_name(o.schedule, result.reschedule, layout.chunks)}, policy {p.policy}: {p.num_stages} "
               f"stages x {o.microbatches} micro-batches, {powers(case.overheads)}")
    for line in result.notes:
        click.echo(line)
    if p.peak_memory_bytes is not None:
        click.echo(describe_peaks(p.peak_memory_bytes))
    shown = Shown(result.timeline, unit_clocks(p, result.timeline.dag), result.baseline, baseline_name(layout))
    show(shown, "simulated on the measured profile:", o.outputs)
    if result.overrun > 0:
        click.echo(f"warning: this plan is {100 * result.overrun:.2f} % slower than the {baseline_name(layout)} "
                   f"baseline: EnvPipe's {o.policy} policy does not keep to a time budget (--policy optimal does)",
                   err=True)
    write_outputs(shown, p, o.outputs,
                  f"{o.schedule} / {p.policy}: {p.num_stages} stages x {o.microbatches} micro-batches")


@main.command()
@profile_option
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False),
              help="plan JSON (from `envpipe plan --out`, or written by hand)")
@stages_option
@blocking_option
@tail_power_option
@click.option("--gpu", type=click.Choice(GPU_NAMES, case_sensitive=False), default="all", show_default=True,
              help="only used to pick a default --blocking-power")
@transfer_option
@tail_option
@text_option
@gantt_option
def simulate(**options: Any) -> None:
    """Recompute iteration time and energy of any plan (also one written by hand)."""
    given = replace(CaseOptions.of(options), gpu=options["gpu"].lower())
    given.blocking_power_w()  # a missing power is a usage error before any work
    plan_path, outputs = options["plan_path"], Outputs(options["text"], None, options["gantt"])
    try:
        plan_obj = Plan.load(plan_path)
    except PlanError as exc:
        raise click.ClickException(str(exc)) from None
    chunk_rows = plan_obj.num_stages * plan_obj.chunks if plan_obj.chunks > 1 else None
    profile, note = _load(options["profile_path"], options["stages"], plan_obj.num_microbatches, chunk_rows)
    try:
        layout = plan_obj.layout()
        if profile.num_stages not in (layout.num_stages, layout.num_model_stages):
            raise PlanError(f"plan has {plan_obj.num_stages} stages but the profile has {profile.num_stages}")
        case = given.case(profile, plan_obj.num_microbatches, layout)
        plan_obj.check_profile(profile)
        tl = evaluate_plan(plan_obj, case)
        base = baseline_timeline(case)
    except _USER_ERRORS as exc:
        raise click.ClickException(f"{plan_path}: {exc}") from None
    if note:
        click.echo(note, err=True)
    shown = Shown(tl, unit_clocks(plan_obj, tl.dag), base, baseline_name(layout))
    show(shown, f"{plan_path} simulated on {options['profile_path']}:", outputs)
    claimed = plan_obj.predicted.get("iteration_time_s")
    if claimed is not None and abs(claimed - tl.iteration_time) > 1e-9 * max(1.0, claimed):
        click.echo(f"note: the plan claims {claimed:.4f} s; the simulation gives {tl.iteration_time:.4f} s", err=True)
    write_outputs(shown, None, outputs, f"{plan_path}")

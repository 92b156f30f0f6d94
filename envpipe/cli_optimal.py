"""The `envpipe plan --policy optimal` part of the CLI: options, output and the frontier.

The optimal planner needs scipy, which takes longer to import than the rest of the CLI together: it is
imported when a command runs the planner, not when the CLI starts (benchmarks/bench_planner_scale.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from envpipe.cli_common import Finite, output_option, show, write_outputs
from envpipe.limits import MAX_BUDGET_S, MAX_FRONTIER_POINTS, MAX_SLOWDOWN
from envpipe.plan.memory import StageMemory, describe_peaks
from envpipe.plan.planfile import unit_clocks
from envpipe.plan.simulate import Timeline
from envpipe.profile import Profile

if TYPE_CHECKING:
    from envpipe.plan.frontier import FrontierPoint


def optimal_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--max-slowdown", type=Finite(0, MAX_SLOWDOWN), default=None,
                     help="optimal: allowed slowdown over the 1F1B all-max time, e.g. 0.01 for 1%"),
        click.option("--time-budget", type=Finite(0, MAX_BUDGET_S, low_open=True), default=None,
                     help="optimal: iteration-time budget in seconds"),
        output_option("--frontier", "frontier_csv", suffixes=(".csv",),
                      help="optimal: write the time-energy frontier CSV here (plans and a .png plot next to it)"),
        click.option("--frontier-points", type=click.IntRange(2, MAX_FRONTIER_POINTS), default=20, show_default=True,
                     help="optimal: number of budgets on the frontier"),
    ]):
        func = option(func)
    return func


@dataclass(frozen=True)
class OptimalArgs:
    max_slowdown: float | None
    time_budget: float | None
    frontier_csv: str | None
    frontier_points: int
    out: str | None
    text: bool
    gantt: str | None


def run_optimal(profile: Profile, microbatches: int, schedule: str, watts: float, transfer_s: float,
                memory: StageMemory | None, args: OptimalArgs, tail_s: float | np.ndarray, note: str | None, *,
                chunks: int | None = None, stages: int | None = None) -> None:
    """``tail_s``: each stage's work after its last unit (one number or one per stage); ``chunks``, ``stages``:
    the layout of interleaved 1F1B and DualPipeV; as in make_plan. ``note``: what the user should know about
    the profile, shown once planning worked."""
    if args.frontier_csv is not None:
        if args.max_slowdown is not None or args.time_budget is not None:
            raise click.UsageError("--frontier sweeps all budgets; drop --max-slowdown/--time-budget")
        _run_frontier(profile, microbatches, schedule, watts, transfer_s, memory, args, tail_s, note, chunks, stages)
        return
    from envpipe.plan.optimal import optimal_plan

    try:
        result = optimal_plan(profile, microbatches, idle_power_w=watts, schedule=schedule,
                              time_budget_s=args.time_budget, max_slowdown=args.max_slowdown,
                              transfer_s=transfer_s, memory=memory, tail_s=tail_s, chunks=chunks, stages=stages)
    except ValueError as exc:  # also InfeasibleBudget and MemoryLimitError
        raise click.ClickException(str(exc)) from None
    if note:
        click.echo(note, err=True)
    p = replace(result.plan, profile_digest=profile.digest)
    click.echo(f"schedule {schedule}, policy optimal, {p.num_stages} stages x {microbatches} micro-batches, "
               f"idle power {watts} W, time budget {result.budget_s:.4f} s")
    for r, energy in result.tried:
        shown = "infeasible" if energy is None else f"{energy:.1f} J"
        click.echo(f"order with extra warm-up forwards r_s={r}: {shown}")
    click.echo(f"chosen r_s: {result.reschedule}" + (" (plain 1F1B)" if not any(result.reschedule) else
                                                     " (EnvPipe warm-up counts saved more)"))
    if result.lp_energy is not None:
        click.echo(f"LP lower bound for this order: {result.lp_energy:.1f} J")
    if p.peak_memory_bytes is not None:
        click.echo(describe_peaks(p.peak_memory_bytes))
    clocks = unit_clocks(p, result.timeline.dag)
    show(result.timeline, result.baseline, clocks, "simulated on the measured profile:", args.text)
    write_outputs(p, args.out, result.timeline, clocks, args.gantt,
                  f"{schedule} / optimal: {p.num_stages} stages x {microbatches} micro-batches (simulated)")


def _run_frontier(profile: Profile, microbatches: int, schedule: str, watts: float, transfer_s: float,
                  memory: StageMemory | None, args: OptimalArgs, tail_s: float | np.ndarray, note: str | None,
                  chunks: int | None, stages: int | None) -> None:
    assert args.frontier_csv is not None
    from tqdm import tqdm

    from envpipe.plan.frontier import frontier, write_frontier

    try:
        # on a terminal only (disable=None): a log or a pipe gets no carriage-return noise
        with tqdm(total=args.frontier_points, desc="frontier", unit="point", disable=None, leave=False) as bar:
            points = frontier(profile, microbatches, idle_power_w=watts, schedule=schedule,
                              points=args.frontier_points, transfer_s=transfer_s, memory=memory,
                              tail_s=tail_s, chunks=chunks, stages=stages, on_point=bar.update)
    except ValueError as exc:  # also InfeasibleBudget and MemoryLimitError
        raise click.ClickException(str(exc)) from None
    if note:
        click.echo(note, err=True)
    points = [replace(pt, plan=replace(pt.plan, profile_digest=profile.digest)) for pt in points]
    base = points[0].baseline
    try:
        plan_dir, png = write_frontier(points, Path(args.frontier_csv), base)
    except OSError as exc:
        raise click.ClickException(f"cannot write the frontier to {args.frontier_csv}: {exc}") from None
    click.echo(f"frontier ({len(points)} points, simulated on the measured profile; baseline 1F1B all-max "
               f"{base.iteration_time:.4f} s, {base.energy:.1f} J):")
    click.echo("\n".join(frontier_rows(points, base)))
    click.echo(f"CSV written to {args.frontier_csv}, plans under {plan_dir}, plot {png}")


def frontier_rows(points: list[FrontierPoint], base: Timeline) -> list[str]:
    """A table with the budget of each point, time and energy with enough digits to tell neighbours apart,
    and a mark where a longer budget kept the previous plan (more time would only add idle energy)."""
    step = (points[-1].budget_s - points[0].budget_s) / max(len(points) - 1, 1)
    digits = max(4, 1 - math.floor(math.log10(step))) if step > 0 else 4
    w = max(10, digits + 5)
    rows = [f"  {'budget (s)':>{w}}  {'time (s)':>{w}}  {'energy (J)':>12}  {'saving (%)':>10}"]
    for i, p in enumerate(points):
        same = i > 0 and (p.time_s, p.energy_j) == (points[i - 1].time_s, points[i - 1].energy_j)
        rows.append(f"  {p.budget_s:{w}.{digits}f}  {p.time_s:{w}.{digits}f}  {p.energy_j:12.2f}  "
                    f"{100 * (1 - p.energy_j / base.energy):10.3f}" + ("  same plan as above" if same else ""))
    return rows

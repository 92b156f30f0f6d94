"""The `envpipe plan --policy optimal` part of the CLI: options, output and the frontier.

The optimal planner needs scipy, which takes longer to import than the rest of the CLI together: it is
imported when a command runs the planner, not when the CLI starts (benchmarks/bench_planner_scale.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from envpipe.plan.gantt import draw_gantt
from envpipe.plan.memory import StageMemory, describe_peaks
from envpipe.plan.render import summary_table, text_trace
from envpipe.profile import Profile

if TYPE_CHECKING:
    from envpipe.plan.optimal import OptimalResult


def optimal_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--max-slowdown", type=click.FloatRange(min=0), default=None,
                     help="optimal: allowed slowdown over the 1F1B all-max time, e.g. 0.01 for 1%"),
        click.option("--time-budget", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="optimal: iteration-time budget in seconds"),
        click.option("--frontier", "frontier_csv", type=click.Path(dir_okay=False), default=None,
                     help="optimal: write the time-energy frontier CSV here (plans and a .png plot next to it)"),
        click.option("--frontier-points", type=click.IntRange(min=2), default=20, show_default=True,
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
                memory: StageMemory | None, args: OptimalArgs, tail_s: float | np.ndarray, *,
                chunks: int | None = None, stages: int | None = None) -> None:
    """``tail_s``: each stage's work after its last unit (one number or one per stage); ``chunks``, ``stages``:
    the layout of interleaved 1F1B and DualPipeV; as in make_plan."""
    if args.frontier_csv is not None:
        if args.max_slowdown is not None or args.time_budget is not None:
            raise click.UsageError("--frontier sweeps all budgets; drop --max-slowdown/--time-budget")
        _run_frontier(profile, microbatches, schedule, watts, transfer_s, memory, args, tail_s, chunks, stages)
        return
    from envpipe.plan.optimal import optimal_plan

    try:
        result = optimal_plan(profile, microbatches, idle_power_w=watts, schedule=schedule,
                              time_budget_s=args.time_budget, max_slowdown=args.max_slowdown,
                              transfer_s=transfer_s, memory=memory, tail_s=tail_s, chunks=chunks, stages=stages)
    except ValueError as exc:  # also InfeasibleBudget and MemoryLimitError
        raise click.ClickException(str(exc)) from None
    p = result.plan
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
    freqs = _freqs(result)
    if args.text:
        click.echo(text_trace(result.timeline, freqs))
    click.echo(summary_table(result.timeline, result.baseline, "simulated on the measured profile:"))
    if args.out:
        p.save(args.out)
        click.echo(f"plan written to {args.out}")
    if args.gantt:
        draw_gantt(result.timeline, freqs, args.gantt,
                   f"{schedule} / optimal: {p.num_stages} stages x {microbatches} micro-batches (simulated)")
        click.echo(f"Gantt picture written to {args.gantt}")


def _freqs(result: OptimalResult) -> np.ndarray:
    """Per-unit clocks (MHz) in the DAG's unit numbering, for the trace and the Gantt picture."""
    dag = result.timeline.dag
    freqs = np.empty(dag.num_units, int)
    for ids, units in zip(dag.order, result.plan.stages, strict=True):
        for i, u in zip(ids, units, strict=True):
            freqs[i] = u.freq_mhz
    return freqs


def _run_frontier(profile: Profile, microbatches: int, schedule: str, watts: float, transfer_s: float,
                  memory: StageMemory | None, args: OptimalArgs, tail_s: float | np.ndarray, chunks: int | None,
                  stages: int | None) -> None:
    from envpipe.plan.frontier import frontier, write_frontier

    assert args.frontier_csv is not None
    try:
        points = frontier(profile, microbatches, idle_power_w=watts, schedule=schedule, points=args.frontier_points,
                          transfer_s=transfer_s, memory=memory, tail_s=tail_s, chunks=chunks, stages=stages)
    except ValueError as exc:  # also InfeasibleBudget and MemoryLimitError
        raise click.ClickException(str(exc)) from None
    base = points[0].baseline
    try:
        plan_dir, png = write_frontier(points, Path(args.frontier_csv), base)
    except OSError as exc:
        raise click.ClickException(f"cannot write the frontier to {args.frontier_csv}: {exc}") from None
    click.echo(f"frontier ({len(points)} points, simulated on the measured profile; baseline 1F1B all-max "
               f"{base.iteration_time:.4f} s, {base.energy:.1f} J):")
    for p in points:
        click.echo(f"  {p.time_s:9.4f} s  {p.energy_j:10.1f} J  {100 * (1 - p.energy_j / base.energy):6.2f} %")
    click.echo(f"CSV written to {args.frontier_csv}, plans under {plan_dir}, plot {png}")

"""The `envpipe plan --policy optimal` part of the CLI: options, output and the frontier.

The optimal planner needs scipy, which takes longer to import than the rest of the CLI together: it is
imported when a command runs the planner, not when the CLI starts (benchmarks/planner_study/scale.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from envpipe.cli_common import Finite, PlanOptions, Shown, Slowdown, output_option, powers, show, write_outputs
from envpipe.limits import MAX_BUDGET_S, MAX_FRONTIER_POINTS, MAX_SECONDS
from envpipe.plan.case import PipelineCase, Planned
from envpipe.plan.evaluate import SCHEDULE_NAMES, baseline_name, unit_clocks
from envpipe.plan.memory import describe_peaks
from envpipe.plan.render import order_name
from envpipe.plan.simulate import Timeline


def optimal_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--max-slowdown", type=Slowdown(), default=None,
                     help="optimal: allowed slowdown over the baseline, a fraction or a percent: 0.01 or 1% (the "
                          "baseline: 1F1B with every unit at the highest clock; for interleaved and dualpipev, that "
                          "schedule's own)"),
        click.option("--time-budget", type=Finite(0, MAX_BUDGET_S, low_open=True), default=None,
                     help="optimal: iteration-time budget in seconds"),
        click.option("--time-limit", type=Finite(0, MAX_SECONDS, low_open=True), default=None,
                     help="optimal: wall-clock seconds the search may take (default: no limit, and then the same "
                          "input always gives the same plan); past it the planner returns the best plan it has "
                          "and says what it left out"),
        output_option("--frontier", "frontier_csv", suffixes=(".csv",),
                      help="optimal: write the time-energy frontier CSV here (plans and a .png plot next to it)"),
        click.option("--frontier-points", type=click.IntRange(2, MAX_FRONTIER_POINTS), default=20, show_default=True,
                     help="optimal: number of budgets on the frontier"),
    ]):
        func = option(func)
    return func


def _budget_source(options: PlanOptions, base: str) -> str:
    if options.time_budget is not None:
        return "given"
    if options.max_slowdown:
        return f"{100 * options.max_slowdown:g} % over the {base} time"
    return f"the {base} time: no slowdown"


def run_optimal(case: PipelineCase, options: PlanOptions, note: str | None) -> None:
    """Plan ``case`` with the optimal planner (or its frontier) and show it. ``note``: what the user should know
    about the profile, shown once planning worked."""
    if options.frontier_csv is not None:
        if options.max_slowdown is not None or options.time_budget is not None:
            raise click.UsageError("--frontier sweeps all budgets; drop --max-slowdown/--time-budget")
        _run_frontier(case, options, note)
        return
    from envpipe.plan.optimal.orders import optimal_plan

    schedule, M, chunks = options.schedule, case.num_microbatches, case.layout.chunks
    try:
        result = optimal_plan(case, schedule, options.time_budget, options.max_slowdown, options.time_limit)
    except ValueError as exc:  # also InfeasibleBudget and MemoryLimitError
        raise click.ClickException(str(exc)) from None
    if note:
        click.echo(note, err=True)
    p = replace(result.plan, profile_digest=case.profile.digest)
    base = baseline_name(case.layout)
    click.echo(f"{SCHEDULE_NAMES[schedule]}, policy optimal: {p.num_stages} stages x {M} micro-batches, "
               f"{powers(case.overheads)}, time budget {result.budget_s:.4f} s "
               f"({_budget_source(options, base)})")
    if len(result.tried) > 1:
        for r, energy in result.tried:
            shown = "no plan within the budget" if energy is None else f"{energy:.1f} J"
            click.echo(f"  tried {order_name(schedule, r, chunks)}: {shown}")
    click.echo(f"chosen order: {order_name(schedule, result.reschedule, chunks)}")
    for line in result.notes:
        click.echo(line)
    if p.peak_memory_bytes is not None:
        click.echo(describe_peaks(p.peak_memory_bytes))
    shown_plan = Shown(result.timeline, unit_clocks(p, result.timeline.dag), result.baseline, base)
    show(shown_plan, "simulated on the measured profile:", options.outputs)
    write_outputs(shown_plan, p, options.outputs, f"{schedule} / optimal: {p.num_stages} stages x {M} micro-batches")


def _run_frontier(case: PipelineCase, options: PlanOptions, note: str | None) -> None:
    assert options.frontier_csv is not None
    from tqdm import tqdm

    from envpipe.plan.optimal.frontier import frontier, write_frontier

    try:
        # on a terminal only (disable=None): a log or a pipe gets no carriage-return noise
        with tqdm(total=options.frontier_points, desc="frontier", unit="point", disable=None, leave=False) as bar:
            points = frontier(case, options.schedule, options.frontier_points, bar.update, options.time_limit)
    except ValueError as exc:  # also InfeasibleBudget and MemoryLimitError
        raise click.ClickException(str(exc)) from None
    if note:
        click.echo(note, err=True)
    points = [replace(pt, plan=replace(pt.plan, profile_digest=case.profile.digest)) for pt in points]
    base = points[0].baseline
    try:
        plan_dir, png = write_frontier(points, Path(options.frontier_csv), base)
    except OSError as exc:
        raise click.ClickException(f"cannot write the frontier to {options.frontier_csv}: {exc}") from None
    for line in points[-1].notes:  # the time limit's, once
        click.echo(line)
    click.echo(f"frontier ({len(points)} points of {SCHEDULE_NAMES[options.schedule]}, simulated on the measured "
               f"profile; baseline {baseline_name(case.layout)} {base.iteration_time:.4f} s, {base.energy:.1f} J):")
    click.echo("\n".join(frontier_rows(points, base)))
    click.echo(f"CSV written to {options.frontier_csv}, plans under {plan_dir}, plot {png}")


def frontier_rows(points: list[Planned], base: Timeline) -> list[str]:
    """A table with the budget of each point, time and energy with enough digits to tell neighbours apart,
    and a mark where a longer budget kept the previous plan (more time would only add idle energy)."""
    budgets = [p.budget_s or 0.0 for p in points]
    step = (budgets[-1] - budgets[0]) / max(len(points) - 1, 1)
    digits = max(4, 1 - math.floor(math.log10(step))) if step > 0 else 4
    w = max(10, digits + 5)
    rows = [f"  {'budget (s)':>{w}}  {'time (s)':>{w}}  {'energy (J)':>12}  {'saving (%)':>10}"]
    for i, (p, budget) in enumerate(zip(points, budgets, strict=True)):
        time_s, energy = p.timeline.iteration_time, p.timeline.energy
        same = i > 0 and (time_s, energy) == (points[i - 1].timeline.iteration_time, points[i - 1].timeline.energy)
        rows.append(f"  {budget:{w}.{digits}f}  {time_s:{w}.{digits}f}  {energy:12.2f}  "
                    f"{100 * (1 - energy / base.energy):10.3f}" + ("  same plan as above" if same else ""))
    return rows

"""The time-energy Pareto frontier: least-energy plans for a sweep of time budgets.

Budgets run from the fastest possible iteration (every unit at its fastest clock) to the time of
the least-energy plan (planned with the all-cheapest time as budget), as Perseus does for stragglers: a job
that must wait anyway takes the least-energy plan for the longer time. Each point is a fresh plan at its
budget (the one `optimal_plan` makes), unless the previous point's plan, which fits every longer budget too,
costs less: the frontier is monotone (more time never costs more energy) and no point is worse than a fresh
plan at its budget. (It used to warm-start each point from the previous one instead of the nearest rounding:
quicker, but up to 0.052 points of saving worse than a fresh plan.)
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from envpipe.plan.case import PipelineCase, Planned
from envpipe.plan.evaluate import plan_from_timeline
from envpipe.plan.optimal import ClockProblem, order_problems, solve
from envpipe.plan.simulate import Timeline


def frontier(case: PipelineCase, schedule: str = "1f1b", points: int = 20,
             on_point: Callable[[], None] | None = None) -> list[Planned]:
    """``points`` plans, fastest first, on the best of the candidate orders at each budget (as in optimal_plan;
    ``on_point``: called after each point, for progress)."""
    if points < 2:
        raise ValueError("a frontier needs at least 2 points")
    baseline, problems = order_problems(case, schedule)
    lo = min(p.fastest_time() for _, p in problems)
    slowest = max(p.simulate(p.cheapest_option()).iteration_time for _, p in problems)
    # past the least-energy plan's time, more time only adds idle energy: end the sweep there
    hi = _best_at(problems, slowest)[0].iteration_time
    result: list[Planned] = []
    for budget in np.linspace(lo, max(hi, lo), points):
        tl, option, problem, r = _best_at(problems, float(budget))
        plan = replace(plan_from_timeline(tl, problem.freqs_mhz(option), schedule, "optimal", baseline),
                       peak_memory_bytes=problem.peak_memory_bytes)
        point = Planned(plan, tl, baseline, r, float(budget), [(r, tl.energy)])
        if result and result[-1].timeline.energy <= point.timeline.energy:
            point = replace(result[-1], budget_s=float(budget))
        result.append(point)
        if on_point:
            on_point()
    return result


def _best_at(problems: list[tuple[list[int], ClockProblem]], budget: float
             ) -> tuple[Timeline, np.ndarray, ClockProblem, list[int]]:
    """The best order's plan at ``budget``."""
    best = None
    for r, problem in problems:
        if problem.fastest_time() > budget:
            continue
        sol = solve(problem, budget)
        if best is None or sol.timeline.energy < best[0].energy:
            best = (sol.timeline, sol.option, problem, r)
    assert best is not None  # the sweep starts at the fastest order's time
    return best


def write_frontier(points: list[Planned], csv_path: str | Path, baseline: Timeline) -> tuple[Path, Path]:
    """CSV (budget, time, energy, saving, plan file per point), the plans as JSON, and a plot next to it."""
    csv_path = Path(csv_path)
    plan_dir = csv_path.with_suffix("")
    plan_dir = plan_dir.parent / f"{plan_dir.name}_plans"
    plan_dir.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["budget_s", "time_s", "energy_j", "saving_pct", "reschedule", "plan"])
        for i, p in enumerate(points):
            plan_path = plan_dir / f"point_{i:03d}.json"
            p.plan.save(plan_path)
            w.writerow([f"{p.budget_s:.6f}", f"{p.timeline.iteration_time:.6f}", f"{p.timeline.energy:.3f}",
                        f"{100 * (1 - p.timeline.energy / baseline.energy):.3f}", " ".join(map(str, p.reschedule)),
                        str(plan_path)])
    png = csv_path.with_suffix(".png")
    _plot(points, baseline, png)
    return plan_dir, png


def _plot(points: list[Planned], baseline: Timeline, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p.timeline.iteration_time for p in points], [p.timeline.energy for p in points], "o-",
            label="optimal (simulated)")
    ax.plot([baseline.iteration_time], [baseline.energy], "x", color="red", label="all-max baseline")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title("time-energy frontier (simulated on the profile)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

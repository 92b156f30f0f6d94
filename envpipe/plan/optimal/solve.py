"""One order at one budget: the LP relaxation, its roundings, repair, improvement and polish (the method is in
the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.plan.optimal.lp import InfeasibleBudget, RelaxationStopped, solve_relaxation
from envpipe.plan.optimal.milp import MilpUnsolved, Neighbourhood, solve_milp
from envpipe.plan.optimal.problem import ClockProblem
from envpipe.plan.optimal.timelimit import TimeLimit
from envpipe.plan.simulate import Timeline

_MAX_PASSES = 200
_FULL_HULL_UNITS = 8192
_NEAREST_UNITS = 2048  # above, error diffusion alone: it wins there and nearest rounding's repair is slow
# above _FULL_HULL_UNITS, on-time rounding instead of error diffusion: as good (measured 32 x 512 and 64 x 1,024:
# 0.005-0.025 points more saving) and within the budget by construction, where diffusion's repair took hundreds of
# simulations of the whole DAG (20 s at 64 x 1,024)
_COARSE_SEGMENTS = 4
_POLISH_UNITS = 256  # neighbourhood MILP only on small DAGs, where HiGHS is quick
_POLISH_BINARIES = 1024  # ... and only when the neighbourhood has at most this many (unit, option) pairs
_POLISH_RADIUS = 3  # each unit may move this many menu options either way: reaches past a non-hull option
_POLISH_NODES = 20  # branch-and-bound nodes per round: a count, so results do not depend on load
_POLISH_ROUNDS = 10  # rounds re-centre the neighbourhood on the last improvement


@dataclass(frozen=True)
class Solution:
    option: np.ndarray  # (N,) menu option per unit
    timeline: Timeline
    lp_energy: float | None  # LP lower bound on the energy within the budget (None: folded or coarse LP, no bound)


def _within(time: float, budget: float) -> bool:
    """Exactly: the simulation is deterministic, so the plan file re-simulates to the same number."""
    return time <= budget


def infeasible(budget_s: float, fastest_s: float) -> InfeasibleBudget:
    """The error for a budget below the all-fastest iteration, with digits enough to see the gap."""
    return InfeasibleBudget(f"time budget {budget_s:.12g} s is infeasible: with every unit at its fastest clock "
                            f"the iteration takes {fastest_s:.12g} s ({fastest_s - budget_s:.3g} s more)")


def solve(problem: ClockProblem, budget_s: float, limit: TimeLimit | None = None) -> Solution:
    """Least-energy clocks for one budget (relaxation, rounding, repair, improvement, polish). Every limit inside is
    a count; ``limit`` is the user's wall-clock limit (none by default): once it is up, the rest is left out."""
    limit = TimeLimit() if limit is None else limit
    fastest = problem.fastest_time()
    if not _within(fastest, budget_s):
        raise infeasible(budget_s, fastest)
    # very large DAGs: a coarser hull keeps the LP tractable; rounding and improvement use the full menus
    small = problem.dag.num_units <= _FULL_HULL_UNITS
    segments = None if small else _COARSE_SEGMENTS
    try:  # a large DAG's whole LP is never solved: where its fold has no solution, the all-fastest plan
        relax = solve_relaxation(problem.menus, problem.edges, budget_s, problem.fold, segments, limit.left_s(),
                                 unfold=small)
    except RelaxationStopped:
        limit.up("the LP relaxation")
        return at_fastest(problem, budget_s)
    except InfeasibleBudget:  # within HiGHS's tolerance of the all-fastest time: nothing but it fits anyway
        return at_fastest(problem, budget_s)
    roundings = [problem.fit(relax.duration + 1e-9)]
    if not limit.up("other roundings of the LP"):
        if problem.dag.num_units <= _FULL_HULL_UNITS:
            roundings.append(_diffused(problem, relax.duration))
        else:
            roundings.append(_on_time(problem, relax.end))
        if problem.dag.num_units <= _NEAREST_UNITS:  # nearest rounding needs many repair steps on large DAGs
            roundings.append(_nearest(problem, relax.duration))
    option, tl = _best_finished(problem, roundings, budget_s)
    if problem.dag.num_units <= _POLISH_UNITS:
        option, tl = _polish(problem, option, tl, budget_s, limit)
    return Solution(option, tl, relax.energy if segments is None and not relax.folded else None)


def at_fastest(problem: ClockProblem, budget_s: float) -> Solution:
    """Every unit at its fastest clock, with its free float handed out: the plan without an LP."""
    option, tl = _best_finished(problem, [np.zeros(problem.dag.num_units, int)], budget_s)
    return Solution(option, tl, None)


def _best_finished(problem: ClockProblem, options: list[np.ndarray], budget_s: float) -> tuple[np.ndarray, Timeline]:
    """The least-energy feasible plan made from ``options``: each one repaired to the budget, then taken with its
    free float handed out (improve) or without, whichever costs less. Float that lengthens the iteration costs
    every stage's blocking power for the extra time, which can be more than the slower units save."""
    best: tuple[np.ndarray, Timeline] | None = None
    for option in options:
        repaired = _repair(problem, option, budget_s)
        # improve hands out free float up to a relative 1e-12 (fit's tolerance): the last repair makes sure
        try:
            improved = _repair(problem, _improve(problem, repaired, budget_s), budget_s)
        except InfeasibleBudget:  # times so small (subnormal) that no critical path is found to repair
            improved = repaired
        for candidate in (improved, repaired):  # on a tie, the improved one
            tl = problem.simulate(candidate)
            if best is None or tl.energy < best[1].energy:
                best = (candidate, tl)
    assert best is not None
    return best


def _polish(problem: ClockProblem, option: np.ndarray, timeline: Timeline, budget_s: float,
            limit: TimeLimit) -> tuple[np.ndarray, Timeline]:
    """Large-neighbourhood search: the exact MILP restricted to options within _POLISH_RADIUS of each
    unit's current one. It finds the multi-unit exchanges (speed some units up, slow others down) that
    rounding and free float miss. Repeats around each improvement (at most _POLISH_ROUNDS rounds of at most
    _POLISH_NODES branch-and-bound nodes: counts, never a clock); kept only if the simulator agrees.

    ``timeline`` is ``option`` simulated; returns the best option and its simulated timeline (``option`` itself
    where its neighbourhood has more than _POLISH_BINARIES (unit, option) pairs)."""
    allowed = _neighbourhood(problem, option)
    if allowed.sum() > _POLISH_BINARIES:
        return option, timeline
    for _ in range(_POLISH_ROUNDS):
        if limit.up("MILP polish rounds"):
            break
        try:
            found, _ = solve_milp(problem.menus, problem.edges, budget_s, within=Neighbourhood(allowed, _POLISH_NODES),
                                  time_limit_s=limit.left_s())
        except (MilpUnsolved, InfeasibleBudget):  # no better point found (or none within HiGHS's tolerances)
            break
        tl = problem.simulate(found)
        if not (_within(tl.iteration_time, budget_s) and tl.energy < timeline.energy * (1 - 1e-12)):
            break
        option, timeline = found, tl
        allowed = _neighbourhood(problem, option)
    return option, timeline


def _neighbourhood(problem: ClockProblem, option: np.ndarray) -> np.ndarray:
    """(N, K) options within _POLISH_RADIUS of each unit's current one (and real, not padding)."""
    K = problem.menus.time.shape[1]
    k = np.arange(K)[None, :]
    return (np.abs(k - option[:, None]) <= _POLISH_RADIUS) & (k < problem.menus.size[:, None])


def _nearest(problem: ClockProblem, duration: np.ndarray) -> np.ndarray:
    """Per unit, the menu option closest in time to the LP duration (may overshoot: repair fixes it)."""
    return np.argmin(np.abs(problem.menus.time - duration[:, None]), axis=1)


def _diffused(problem: ClockProblem, duration: np.ndarray) -> np.ndarray:
    """Per stage, in execution order, the clock nearest the LP duration plus the rounding error carried from
    the stage's previous units (error diffusion): a stretch of units whose LP durations lie between two clocks
    alternates between them, so the stage keeps the LP's pace and, nearly, its cost (the LP spreads slack
    evenly over a periodic middle, where rounding each unit alone loses it)."""
    order = np.asarray(problem.dag.order)  # (S, units per stage)
    option = np.empty(problem.dag.num_units, int)
    carry = np.zeros(order.shape[0])
    rows = np.arange(order.shape[0])
    for units in order.T:
        target = duration[units] + carry
        times = problem.menus.time[units]
        pick = np.argmin(np.abs(times - target[:, None]), axis=1)
        option[units] = pick
        carry = target - times[rows, pick]
    return option


def _on_time(problem: ClockProblem, lp_end: np.ndarray) -> np.ndarray:
    """Level by level, each unit starts when its predecessors, so rounded, let it and takes the slowest option
    that still ends by its end in the LP's schedule: a unit whose predecessors ended early takes the time they
    left, so a stage keeps the LP's pace (as error diffusion does) and, by induction, every unit ends by its LP
    end: the LP's schedule meets the budget, so this plan does too, and needs no repair."""
    dag, menus = problem.dag, problem.menus
    transfer = problem.overheads.transfer_s
    option = np.zeros(dag.num_units, int)
    end = np.zeros(dag.num_units + 1)  # index N: no predecessor, ended at 0
    for level, ps, pd, crosses in dag.level_edges:
        start = np.maximum(end[ps], end[pd] + crosses * transfer)
        times = menus.time[level]
        fits = (times <= (lp_end[level] - start)[:, None] * (1 + 1e-12)).sum(axis=1) - 1
        option[level] = np.maximum(fits, 0)  # the fastest when even it is late (the LP's tolerance)
        end[level] = start + times[np.arange(level.size), option[level]]
    return option


def _repair(problem: ClockProblem, option: np.ndarray, budget_s: float) -> np.ndarray:
    """Speed up critical units, the least cost per second saved first, until the budget holds.

    Each round takes as many of the critical path's cheapest one-step speed-ups as half its overshoot needs
    (they all shorten that path), then re-simulates: another path may have become critical, and halving
    leaves the last, decisive steps to one unit at a time, as a plain greedy would take them."""
    option = option.copy()
    tl = problem.simulate(option)
    while not _within(tl.iteration_time, budget_s):
        path = np.asarray(tl.critical_path())
        path = path[option[path] > 0]
        if path.size == 0:  # pragma: no cover - solve() checked the all-fastest time first
            raise infeasible(budget_s, problem.fastest_time())
        o = option[path]
        dt = problem.menus.time[path, o] - problem.menus.time[path, o - 1]
        dc = problem.menus.cost[path, o - 1] - problem.menus.cost[path, o]
        cheapest = np.argsort(dc / dt, kind="stable")
        needed = int(np.searchsorted(np.cumsum(dt[cheapest]), 0.5 * (tl.iteration_time - budget_s))) + 1
        faster = path[cheapest[:needed]]
        option[faster] -= 1
        tl = problem.simulate(option, tl, faster)
    return option


def _improve(problem: ClockProblem, option: np.ndarray, budget_s: float) -> np.ndarray:
    """Hand out free float (earliest schedule, then latest schedule) until no unit gets cheaper."""
    dag, succ = problem.dag, problem.successors
    N = dag.num_units
    option = option.copy()
    rows = np.arange(N)
    cap = problem.end_caps(budget_s)
    for _ in range(_MAX_PASSES):
        changed = False
        for direction in ("early", "late"):
            dur = problem.menus.time[rows, option]
            if direction == "early":
                tl = problem.simulate(option)
                start = np.r_[tl.start, np.inf]
                bound = np.minimum(np.minimum(start[succ.same], start[succ.data] - succ.lag_out[:N]), cap)
                free = bound - tl.end
            else:
                late_start, late_end = _latest(problem, dur, cap)
                fin = np.r_[late_end, 0.0]
                bound = np.maximum(np.maximum(fin[dag.pred_same], fin[dag.pred_data] + succ.lag_in), 0.0)
                free = late_start - bound
            new = np.maximum(problem.fit(dur + np.maximum(free, 0.0)), option)
            if np.any(new != option):
                option, changed = new, True
        if not changed:
            break
    return option


def _latest(problem: ClockProblem, dur: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latest start and end of every unit with durations ``dur`` such that the iteration (tails included) still
    ends by the budget; ``cap`` is each unit's latest end allowed by the budget and its stage's tail."""
    dag, succ = problem.dag, problem.successors
    N = dag.num_units
    late_start = np.full(N + 1, np.inf)
    late_end = np.empty(N)
    for level in reversed(dag.levels):
        fin = np.minimum(late_start[succ.same[level]], late_start[succ.data[level]] - succ.lag_out[level])
        late_end[level] = np.minimum(fin, cap[level])
        late_start[level] = late_end[level] - dur[level]
    return late_start[:N], late_end



"""Optimal energy planner: a clock for every unit, least iteration energy within a time budget.

Method (docs/optimal-planner.md has the long form):

1. Menus (menus.py): with the unit order fixed, energy = sum_u (e_u - P t_u) + S P T, a discrete
   time-cost trade-off on the DAG. Per (stage, kind) only Pareto clocks matter.
2. LP relaxation (lp.py): convex hull of each menu, precedence edges, makespan <= budget, solved
   with HiGHS on sparse matrices, on a periodic fold of the middle micro-batches when M is large
   (fold.py). Gives fractional durations, and a lower bound when not folded.
3. Rounding, three ways, keeping the best result: (a) each unit takes the slowest menu clock not
   slower than its LP duration (durations only shrink, so the budget holds); (b) error diffusion along
   each stage (on DAGs above _FULL_HULL_UNITS: on-time rounding, each unit ending by its end in the LP's
   schedule, which needs no repair); (c) each unit takes the clock nearest its LP duration (small DAGs); then
   *repair* speeds up the critical units with the least extra cost per second saved until the simulated time
   meets the budget exactly.
4. Improve: alternately give each unit its *free float* in the earliest schedule and in the latest
   schedule (slack it can take without moving any other unit), choosing the cheapest clock that fits.
   Slowing every unit within its own free float at once never moves another unit, so every pass is
   safe; passes repeat until nothing changes. Float that lengthens the iteration costs every stage's
   blocking power, which can outweigh what the units save: each rounding is kept improved or not,
   whichever costs less (the best feasible).
5. Polish (small DAGs): a large-neighbourhood search, the exact MILP restricted to options within
   a few menu steps of each unit's current one, repeated around each improvement under a node limit
   and a round limit; kept only if the simulator confirms it is better.
6. Every result is re-simulated with envpipe.plan.simulate; that simulation is what is reported.
7. Single plans come from a ladder of budgets (envpipe.plan.ladder), so more time never costs more energy.

Every limit inside is a count (passes, rounds, nodes), never a clock: the same input gives the same plan at any
load. The user's wall-clock limit (envpipe.plan.timelimit, off by default) is the only clock, and the plan says
when it cut the search short.

A per-stage tail (gradient all-reduce, optimizer step after the stage's last unit) enters as the
simulator has it: the iteration ends when every stage has finished its tail, so each stage's last
unit must end by budget - tail (LP and MILP rows, free float, latest schedule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from envpipe.limits import MAX_LP_UNITS
from envpipe.plan.case import PipelineCase, Planned
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import baseline_timeline, plan_from_timeline
from envpipe.plan.fold import Fold, periodic_fold
from envpipe.plan.ladder import BOUND_UNITS, Ladder, best_within
from envpipe.plan.lp import Edges, InfeasibleBudget, RelaxationStopped, dag_edges, solve_relaxation
from envpipe.plan.memory import warmup_caps
from envpipe.plan.menus import UnitMenus, unit_menus
from envpipe.plan.milp import MilpUnsolved, Neighbourhood, solve_milp
from envpipe.plan.policies import valley_clocks
from envpipe.plan.schedules import CHUNKED, build_schedule, check_schedule, reschedule_counts
from envpipe.plan.simulate import Overheads, Timeline, resimulate, simulate
from envpipe.plan.timelimit import TimeLimit

_MAX_PASSES = 200
# steady micro-batches kept unfolded after the warm-up and before the cool-down, beyond the number of stages:
# the transient lasts about a pipeline's length; measured: the folded LP then matches the full one
_FOLD_MARGIN = 2
# ... but at most this many: with 64 stages a margin of 66 made the LP 3-4 times larger for 0.011 points of
# saving (GPT-3/A100 tiled, 64 x 1,024, measured 2026-11-28: benchmarks/results/planner_scale.md)
_MAX_FOLD_MARGIN = 32
# micro-batches per folded period (a multiple of the schedule's own period): one would do for the LP value,
# but its single representative is fractional in every copy, which rounding then loses; with 16 the LP's
# vertex mixes clocks inside the period instead (measured on the four real profiles at M = 96: at most
# 0.04 points of saving below the full LP's plan, against up to 0.7 with one)
_FOLD_PERIOD = 16
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


class PlanTooLarge(ValueError):
    """An order's LP is beyond the planner's limit (envpipe.limits.MAX_LP_UNITS)."""


@dataclass(frozen=True)
class Successors:
    """Each unit's successors in the DAG and the lag on its edges (N: none): what the latest schedule and the
    free float walk forwards."""

    same: np.ndarray  # (N,) next unit on the stage
    data: np.ndarray  # (N,) the unit that needs this one's output
    lag_in: np.ndarray  # (N,) lag on the edge pred_data[u] -> u
    lag_out: np.ndarray  # (N + 1,) lag on the edge u -> data[u]


@dataclass(frozen=True, eq=False)
class ClockProblem:
    """One fixed unit order with its menus: everything a budget sweep reuses."""

    dag: PipelineDag
    menus: UnitMenus
    edges: Edges
    overheads: Overheads
    freqs: np.ndarray  # the profile's clocks (MHz), indexed like the menus' clock indices
    fold: Fold  # the periodic fold the LP is solved on (envpipe.plan.fold)
    peak_memory_bytes: list[int] | None = None  # per stage, when the order was checked against a memory model

    @property
    def tail(self) -> np.ndarray:
        """(S,) per-stage tail after the last unit (seconds)."""
        return self.edges.tail

    @cached_property
    def successors(self) -> Successors:
        dag = self.dag
        N = dag.num_units
        succ_same = np.full(N, N)
        has = dag.pred_same != N
        succ_same[dag.pred_same[has]] = np.flatnonzero(has)
        succ_data = np.full(N, N)
        has = dag.pred_data != N
        succ_data[dag.pred_data[has]] = np.flatnonzero(has)
        lag_in = np.where(dag.data_crosses, self.overheads.transfer_s, 0.0)
        lag_out = np.zeros(N + 1)
        lag_out[:N][dag.pred_data[has]] = lag_in[has]
        return Successors(succ_same, succ_data, lag_in, lag_out)

    def simulate(self, option: np.ndarray, previous: Timeline | None = None,
                 changed: np.ndarray | None = None) -> Timeline:
        """The timeline of ``option``; with ``previous`` (another option's) and the units whose option differs
        from it, only the levels from the earliest changed unit on are recomputed."""
        _, dur, energy = self.menus.pick(option)
        if previous is None or changed is None:
            return simulate(self.dag, dur, energy, self.overheads)
        return resimulate(previous, dur, energy, changed)

    def end_caps(self, budget_s: float) -> np.ndarray:
        """(N,) latest end of each unit within the budget: its stage's tail must still fit after it."""
        return budget_s - self.tail[self.dag.stage]

    def freqs_mhz(self, option: np.ndarray) -> np.ndarray:
        return self.freqs[self.menus.pick(option)[0]]

    def fastest_time(self) -> float:
        return self.simulate(np.zeros(self.dag.num_units, int)).iteration_time

    def cheapest_option(self) -> np.ndarray:
        return self.menus.size - 1

    def fit(self, limit: np.ndarray) -> np.ndarray:
        """Per unit, the slowest (so cheapest) option whose time is at most ``limit``."""
        fits = (self.menus.time <= limit[:, None] * (1 + 1e-12)).sum(axis=1) - 1
        return np.maximum(fits, 0)


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
        return _at_fastest(problem, budget_s)
    except InfeasibleBudget:  # within HiGHS's tolerance of the all-fastest time: nothing but it fits anyway
        return _at_fastest(problem, budget_s)
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
        allowed = _neighbourhood(problem, option)
        if allowed.sum() <= _POLISH_BINARIES:
            option, tl = _polish(problem, option, tl, allowed, budget_s, limit)
    return Solution(option, tl, relax.energy if segments is None and not relax.folded else None)


def _at_fastest(problem: ClockProblem, budget_s: float) -> Solution:
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


def _polish(problem: ClockProblem, option: np.ndarray, timeline: Timeline, allowed: np.ndarray,
            budget_s: float, limit: TimeLimit) -> tuple[np.ndarray, Timeline]:
    """Large-neighbourhood search: the exact MILP restricted to options within _POLISH_RADIUS of each
    unit's current one. It finds the multi-unit exchanges (speed some units up, slow others down) that
    rounding and free float miss. Repeats around each improvement (at most _POLISH_ROUNDS rounds of at most
    _POLISH_NODES branch-and-bound nodes: counts, never a clock); kept only if the simulator agrees.

    ``timeline`` is ``option`` simulated and ``allowed`` its neighbourhood; returns the best option and
    its simulated timeline."""
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


def resolve_budget(baseline_time_s: float, time_budget_s: float | None, max_slowdown: float | None) -> float:
    if time_budget_s is not None and max_slowdown is not None:
        raise ValueError("give either a time budget or a maximum slowdown, not both")
    if time_budget_s is not None:
        if not time_budget_s > 0:
            raise ValueError(f"time budget must be positive, got {time_budget_s}")
        return float(time_budget_s)
    if max_slowdown is not None:
        if max_slowdown < 0:
            raise ValueError(f"maximum slowdown must not be negative, got {max_slowdown}")
        return baseline_time_s * (1 + max_slowdown)
    return baseline_time_s


def candidate_orders(case: PipelineCase, schedule: str) -> list[list[int]]:
    """Warm-up counts to try: EnvPipe's r_s from the valley clocks of its envelope policy and of its uniform
    policy (they differ when the last stage's valley matters), and plain 1F1B (all 0); no duplicates. The case's
    memory caps r_s so that every stage's in-flight activations fit. Other schedules: their own order only."""
    S, M = case.num_stages, case.num_microbatches
    if schedule != "envpipe":
        return [[0] * S]
    profile = case.profile
    freqs = [int(f) for f in profile.freqs]
    caps = None if case.memory is None else warmup_caps(case.memory, S)
    # the valley sweep sees the unit and transfer times only, not the tails: r_s is a rule on unit times
    untailed = replace(case, overheads=replace(case.overheads, tail_s=np.zeros(S)))
    orders: list[list[int]] = []
    for sweep_last_stage in (False, True):
        valley = valley_clocks(untailed, freqs, sweep_last_stage)
        fwd_opt = [profile.fwd_time[s, profile.freq_index(valley[s])] for s in range(S)]
        r = reschedule_counts(list(profile.bwd_time[:, 0]), fwd_opt, M, caps)
        if any(r) and r not in orders:
            orders.append(r)
    return [*orders, [0] * S]


def build_problem(case: PipelineCase, schedule: str, reschedule: list[int]) -> ClockProblem:
    """The clock problem of one order; with the case's memory the order must fit (MemoryLimitError otherwise)."""
    layout, M = case.layout, case.num_microbatches
    check_schedule(schedule, layout)
    chunks = layout.chunks if schedule in CHUNKED else None
    orders = build_schedule(schedule, layout.num_stages, M, reschedule, chunks)
    peak = None if case.memory is None else case.memory.check(orders, schedule, layout.chunks)
    dag = PipelineDag.from_orders(orders, M, layout)
    period = layout.num_stages if schedule == "interleaved" else 1  # its chunks cycle through groups of P
    # ``period`` micro-batches after which the middle repeats; stages may drift apart through it in orders with
    # extra warm-up forwards (envpipe.plan.fold)
    margin = min(dag.num_stages + _FOLD_MARGIN, _MAX_FOLD_MARGIN)
    fold = periodic_fold(dag, period * -(-_FOLD_PERIOD // period), margin, any(reschedule))
    if fold.size > MAX_LP_UNITS:
        raise PlanTooLarge(f"{layout.num_stages} stages x {M} micro-batches: the optimal planner's LP would have "
                           f"{fold.size:,} units (those of the warm-up, the cool-down and up to {margin} micro-batches "
                           f"around them, which do not repeat); it takes at most {MAX_LP_UNITS:,}: plan fewer "
                           "stages (64 take any number of micro-batches), or use EnvPipe's --policy envelope")
    o = case.overheads
    return ClockProblem(dag, unit_menus(dag, case.model_profile, o), dag_edges(dag, o.transfer_s, o.tail_s), o,
                        case.profile.freqs, fold, peak)


def order_problems(case: PipelineCase, schedule: str) -> tuple[Timeline, list[tuple[list[int], ClockProblem]]]:
    """The baseline and a clock problem per candidate order of ``schedule`` on the case."""
    check_schedule(schedule, case.layout)
    baseline = baseline_timeline(case)
    return baseline, [(r, build_problem(case, schedule, r)) for r in candidate_orders(case, schedule)]


@dataclass(frozen=True)
class Searched:
    """The search's plan at one budget: the best of the candidate orders'."""

    budget_s: float
    solution: Solution
    problem: ClockProblem
    reschedule: list[int]
    tried: list[tuple[list[int], float | None]]  # every order: (r_s, its energy, or None if none fit the budget)

    @property
    def energy(self) -> float:
        return self.solution.timeline.energy


class OrderSearch:
    """The search over a case's candidate orders at any budget, and what the budget ladder (envpipe.plan.ladder)
    needs of it: its rungs, the plan at the fastest rung and LP bounds. Searches are kept, so a frontier's budgets
    share their rungs."""

    def __init__(self, baseline: Timeline, problems: list[tuple[list[int], ClockProblem]], limit: TimeLimit) -> None:
        self.problems, self.limit = problems, limit
        fastest = [p.fastest_time() for _, p in problems]
        slowest = max(p.simulate(p.cheapest_option()).iteration_time for _, p in problems)
        fine = max(p.dag.num_units for _, p in problems) <= BOUND_UNITS
        self.ladder = Ladder(min(fastest), max(baseline.iteration_time, min(fastest)), max(slowest, min(fastest)),
                             fine)
        self._searched: dict[float, Searched] = {}
        self._bounds: dict[float, Callable[[float], float] | None] = {}
        r, problem = problems[int(np.argmin(fastest))]  # the first order of the least fastest time
        sol = _at_fastest(problem, self.ladder.fastest_s)
        self.fastest = Searched(self.ladder.fastest_s, sol, problem, r, [(r, sol.timeline.energy)])

    def at(self, budget_s: float) -> Searched:
        """The best order's plan at ``budget_s`` (at least one order fits it)."""
        if budget_s not in self._searched:
            tried: list[tuple[list[int], float | None]] = []
            best: tuple[Solution, ClockProblem, list[int]] | None = None
            for i, (r, problem) in enumerate(self.problems):
                if i and best is not None and self.limit.up("other unit orders"):
                    break
                try:
                    sol = solve(problem, budget_s, self.limit)
                except InfeasibleBudget:
                    tried.append((r, None))
                    continue
                tried.append((r, sol.timeline.energy))
                if best is None or sol.timeline.energy < best[0].timeline.energy:
                    best = (sol, problem, r)
            if best is None:  # every order failed at a rung it fits (numbers at the edge of floats): all-fastest
                best = (self.fastest.solution, self.fastest.problem, self.fastest.reschedule)
            self._searched[budget_s] = Searched(budget_s, best[0], best[1], best[2], tried)
        return self._searched[budget_s]

    def bound(self, budget_s: float) -> Callable[[float], float] | None:
        """A lower bound on every order's plans at any budget up to ``budget_s``: the tangents of their whole LPs
        (unfolded, full hull) at it. None where an order's whole LP is too large or fails at the edge."""
        if budget_s not in self._bounds:
            self._bounds[budget_s] = self._tangents(budget_s)
        return self._bounds[budget_s]

    def _tangents(self, budget_s: float) -> Callable[[float], float] | None:
        tangents = []
        for _, problem in self.problems:
            if problem.dag.num_units > BOUND_UNITS:
                return None
            fastest = problem.fastest_time()
            if fastest > budget_s:
                continue  # it fits no budget below either
            try:
                relax = solve_relaxation(problem.menus, problem.edges, budget_s)
            except InfeasibleBudget:
                return None
            tangents.append((fastest, relax))
        return lambda b: min((rel.bound_at(b, budget_s) for fastest, rel in tangents if fastest <= b), default=np.inf)

    def within(self, budget_s: float) -> Searched:
        """The least-energy plan on the ladder up to ``budget_s`` (InfeasibleBudget below the fastest time)."""
        return next(self.sweep([budget_s]))

    def sweep(self, budgets: list[float]) -> Iterator[Searched]:
        """``within`` at each of ``budgets`` (ascending), each searching only the rungs above the previous one's."""
        known: tuple[float, Searched, float] | None = None
        for budget in budgets:
            if budget < self.ladder.fastest_s:
                raise infeasible(budget, self.ladder.fastest_s)
            best, rung = best_within(self.ladder, budget, self.at, self.fastest, self.bound, self.limit, known)
            known = (budget, best, rung)
            yield best


def optimal_plan(case: PipelineCase, schedule: str = "1f1b", time_budget_s: float | None = None,
                 max_slowdown: float | None = None, time_limit_s: float | None = None) -> Planned:
    """Least-energy plan of ``case`` within the budget (default: the baseline's time, i.e. no slowdown: 1F1B
    all-max; for interleaved 1F1B and DualPipeV, that schedule's all-max time), in ``schedule``'s order (for
    EnvPipe's: the best of its warm-up counts and plain 1F1B, ``candidate_orders``).

    More budget never gives a dearer plan: the plan is the least-energy one on a ladder of budgets up to the
    budget (envpipe.plan.ladder). With the case's memory only orders that fit are tried (MemoryLimitError if none
    does), and the plan reports its per-stage peak bytes. The iteration, and so the budget, ends when every stage
    has finished its tail, as in envpipe.plan.simulate. ``time_limit_s``: a wall-clock limit on the search (off by
    default: then the same input always gives the same plan); the plan's notes say what it cut.
    """
    limit = TimeLimit(time_limit_s)
    baseline, problems = order_problems(case, schedule)
    budget = resolve_budget(baseline.iteration_time, time_budget_s, max_slowdown)
    search = OrderSearch(baseline, problems, limit)
    found = search.within(budget)
    sol, problem = found.solution, found.problem
    plan = replace(plan_from_timeline(sol.timeline, problem.freqs_mhz(sol.option), schedule, "optimal", baseline),
                   peak_memory_bytes=problem.peak_memory_bytes)
    notes: tuple[str, ...] = () if sol.lp_energy is None else (f"LP lower bound for this order: {sol.lp_energy:.1f} J",)
    if found.budget_s < budget:
        notes += (f"planned for {found.budget_s:.6f} s: the least-energy rung of the budget ladder within the budget "
                  "(so more budget never gives a dearer plan)",)
    return Planned(plan, sol.timeline, baseline, found.reschedule, budget, found.tried, sol.lp_energy,
                   notes=notes + limit.note())

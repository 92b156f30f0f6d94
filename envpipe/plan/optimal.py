"""Optimal energy planner: a clock for every unit, least iteration energy within a time budget.

Method (docs/optimal-planner.md has the long form):

1. Menus (menus.py): with the unit order fixed, energy = sum_u (e_u - P t_u) + S P T, a discrete
   time-cost trade-off on the DAG. Per (stage, kind) only Pareto clocks matter.
2. LP relaxation (lp.py): convex hull of each menu, precedence edges, makespan <= budget, solved
   with HiGHS on sparse matrices, on a periodic fold of the middle micro-batches when M is large
   (fold.py). Gives fractional durations, and a lower bound when not folded.
3. Rounding, three ways, keeping the best result: (a) each unit takes the slowest menu clock not
   slower than its LP duration (durations only shrink, so the budget holds); (b) error diffusion along
   each stage; (c) each unit takes the clock nearest its LP duration (small DAGs); then *repair* speeds
   up the critical units with the least extra cost per second saved until the simulated time meets the
   budget exactly.
4. Improve: alternately give each unit its *free float* in the earliest schedule and in the latest
   schedule (slack it can take without moving any other unit), choosing the cheapest clock that fits.
   Slowing every unit within its own free float at once never moves another unit, so every pass is
   safe; passes repeat until nothing changes. Float that lengthens the iteration costs every stage's
   blocking power, which can outweigh what the units save: each rounding is kept improved or not,
   whichever costs less (the best feasible).
5. Polish (small DAGs): a large-neighbourhood search, the exact MILP restricted to options within
   a few menu steps of each unit's current one, repeated around each improvement under a node limit
   and a time limit scaled to the DAG; kept only if the simulator confirms it is better.
6. Every result is re-simulated with envpipe.plan.simulate; that simulation is what is reported.

A per-stage tail (gradient all-reduce, optimizer step after the stage's last unit) enters as the
simulator has it: the iteration ends when every stage has finished its tail, so each stage's last
unit must end by budget - tail (LP and MILP rows, free float, latest schedule).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from envpipe.plan.case import PipelineCase, Planned
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import baseline_timeline, plan_from_timeline
from envpipe.plan.fold import Fold, periodic_fold
from envpipe.plan.lp import Edges, InfeasibleBudget, dag_edges, solve_relaxation
from envpipe.plan.memory import warmup_caps
from envpipe.plan.menus import UnitMenus, unit_menus
from envpipe.plan.milp import MilpTimeout, Neighbourhood, solve_milp
from envpipe.plan.policies import valley_clocks
from envpipe.plan.schedules import CHUNKED, build_schedule, check_schedule, reschedule_counts
from envpipe.plan.simulate import Overheads, Timeline, resimulate, simulate

_MAX_PASSES = 200
# steady micro-batches kept unfolded after the warm-up and before the cool-down, beyond the number of stages:
# the transient lasts about a pipeline's length; measured: the folded LP then matches the full one
_FOLD_MARGIN = 2
# micro-batches per folded period (a multiple of the schedule's own period): one would do for the LP value,
# but its single representative is fractional in every copy, which rounding then loses; with 16 the LP's
# vertex mixes clocks inside the period instead (measured on the four real profiles at M = 96: at most
# 0.04 points of saving below the full LP's plan, against up to 0.7 with one)
_FOLD_PERIOD = 16
_FULL_HULL_UNITS = 8192
_NEAREST_UNITS = 2048  # above, error diffusion alone: it wins there and nearest rounding's repair is slow
_COARSE_SEGMENTS = 4
_POLISH_UNITS = 256  # neighbourhood MILP only on small DAGs, where HiGHS is quick
_POLISH_BINARIES = 1024  # ... and only when the neighbourhood has at most this many (unit, option) pairs
_POLISH_RADIUS = 3  # each unit may move this many menu options either way: reaches past a non-hull option
_POLISH_NODES = 20  # branch-and-bound nodes per round: deterministic, unlike a time limit
_POLISH_ROUNDS = 10  # rounds re-centre the neighbourhood on the last improvement
_POLISH_SECONDS_PER_UNIT = 0.1  # only a safety net: the node limits decide, so results do not depend on load


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


def solve(problem: ClockProblem, budget_s: float) -> Solution:
    """Least-energy clocks for one budget (relaxation, rounding, repair, improvement, polish)."""
    fastest = problem.fastest_time()
    if not _within(fastest, budget_s):
        raise infeasible(budget_s, fastest)
    # very large DAGs: a coarser hull keeps the LP tractable; rounding and improvement use the full menus
    segments = None if problem.dag.num_units <= _FULL_HULL_UNITS else _COARSE_SEGMENTS
    relax = solve_relaxation(problem.menus, problem.edges, budget_s, problem.fold, segments)
    roundings = [problem.fit(relax.duration + 1e-9), _diffused(problem, relax.duration)]
    if problem.dag.num_units <= _NEAREST_UNITS:  # nearest rounding needs many repair steps on large DAGs
        roundings.append(_nearest(problem, relax.duration))
    option, tl = _best_finished(problem, roundings, budget_s)
    if problem.dag.num_units <= _POLISH_UNITS:
        allowed = _neighbourhood(problem, option)
        if allowed.sum() <= _POLISH_BINARIES:
            option, tl = _polish(problem, option, tl, allowed, budget_s)
    return Solution(option, tl, relax.energy if segments is None and not relax.folded else None)


def _best_finished(problem: ClockProblem, options: list[np.ndarray], budget_s: float) -> tuple[np.ndarray, Timeline]:
    """The least-energy feasible plan made from ``options``: each one repaired to the budget, then taken with its
    free float handed out (improve) or without, whichever costs less. Float that lengthens the iteration costs
    every stage's blocking power for the extra time, which can be more than the slower units save."""
    best: tuple[np.ndarray, Timeline] | None = None
    for option in options:
        repaired = _repair(problem, option, budget_s)
        # improve hands out free float up to a relative 1e-12 (fit's tolerance): the last repair makes sure
        improved = _repair(problem, _improve(problem, repaired, budget_s), budget_s)
        for candidate in (improved, repaired):  # on a tie, the improved one
            tl = problem.simulate(candidate)
            if best is None or tl.energy < best[1].energy:
                best = (candidate, tl)
    assert best is not None
    return best


def _polish(problem: ClockProblem, option: np.ndarray, timeline: Timeline, allowed: np.ndarray,
            budget_s: float) -> tuple[np.ndarray, Timeline]:
    """Large-neighbourhood search: the exact MILP restricted to options within _POLISH_RADIUS of each
    unit's current one. It finds the multi-unit exchanges (speed some units up, slow others down) that
    rounding and free float miss. Repeats around each improvement; kept only if the simulator agrees.

    ``timeline`` is ``option`` simulated and ``allowed`` its neighbourhood; returns the best option and
    its simulated timeline."""
    deadline = time.monotonic() + _POLISH_SECONDS_PER_UNIT * problem.dag.num_units
    for _ in range(_POLISH_ROUNDS):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            found, _ = solve_milp(problem.menus, problem.edges, budget_s, left, Neighbourhood(allowed, _POLISH_NODES))
        except (MilpTimeout, InfeasibleBudget):  # no better point found (or none within HiGHS's tolerances)
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
    fold = periodic_fold(dag, period * -(-_FOLD_PERIOD // period), dag.num_stages + _FOLD_MARGIN, any(reschedule))
    o = case.overheads
    return ClockProblem(dag, unit_menus(dag, case.model_profile, o), dag_edges(dag, o.transfer_s, o.tail_s), o,
                        case.profile.freqs, fold, peak)


def order_problems(case: PipelineCase, schedule: str) -> tuple[Timeline, list[tuple[list[int], ClockProblem]]]:
    """The baseline and a clock problem per candidate order of ``schedule`` on the case."""
    check_schedule(schedule, case.layout)
    baseline = baseline_timeline(case)
    return baseline, [(r, build_problem(case, schedule, r)) for r in candidate_orders(case, schedule)]


def optimal_plan(case: PipelineCase, schedule: str = "1f1b", time_budget_s: float | None = None,
                 max_slowdown: float | None = None) -> Planned:
    """Least-energy plan of ``case`` within the budget (default: the baseline's time, i.e. no slowdown: 1F1B
    all-max; for interleaved 1F1B and DualPipeV, that schedule's all-max time), in ``schedule``'s order (for
    EnvPipe's: the best of its warm-up counts and plain 1F1B, ``candidate_orders``).

    With the case's memory only orders that fit are tried (MemoryLimitError if none does), and the plan reports
    its per-stage peak bytes. The iteration, and so the budget, ends when every stage has finished its tail,
    as in envpipe.plan.simulate.
    """
    baseline, problems = order_problems(case, schedule)
    budget = resolve_budget(baseline.iteration_time, time_budget_s, max_slowdown)
    tried: list[tuple[list[int], float | None]] = []
    best: tuple[Solution, ClockProblem, list[int]] | None = None
    errors = []
    for r, problem in problems:
        try:
            sol = solve(problem, budget)
        except InfeasibleBudget as exc:
            tried.append((r, None))
            errors.append(str(exc))
            continue
        tried.append((r, sol.timeline.energy))
        if best is None or sol.timeline.energy < best[0].timeline.energy:
            best = (sol, problem, r)
    if best is None:
        raise InfeasibleBudget(errors[-1])
    sol, problem, r = best
    plan = replace(plan_from_timeline(sol.timeline, problem.freqs_mhz(sol.option), schedule, "optimal", baseline),
                   peak_memory_bytes=problem.peak_memory_bytes)
    notes = () if sol.lp_energy is None else (f"LP lower bound for this order: {sol.lp_energy:.1f} J",)
    return Planned(plan, sol.timeline, baseline, r, budget, tried, sol.lp_energy, notes=notes)

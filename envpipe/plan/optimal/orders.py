"""The optimal plan of a case: the best of its candidate orders at every rung of the budget ladder, and the
entry point `optimal_plan`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from envpipe.plan.case import PipelineCase, Planned
from envpipe.plan.evaluate import plan_from_timeline
from envpipe.plan.optimal.ladder import BOUND_UNITS, Ladder, best_within
from envpipe.plan.optimal.lp import InfeasibleBudget, solve_relaxation
from envpipe.plan.optimal.problem import ClockProblem, order_problems
from envpipe.plan.optimal.solve import Solution, at_fastest, infeasible, solve
from envpipe.plan.optimal.timelimit import TimeLimit
from envpipe.plan.simulate import Timeline


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
    """The search over a case's candidate orders at any budget, and what the budget ladder (envpipe.plan.optimal.ladder)
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
        sol = at_fastest(problem, self.ladder.fastest_s)
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
            best, rung = best_within(self, budget, known)
            known = (budget, best, rung)
            yield best


def optimal_plan(case: PipelineCase, schedule: str = "1f1b", time_budget_s: float | None = None,
                 max_slowdown: float | None = None, time_limit_s: float | None = None) -> Planned:
    """Least-energy plan of ``case`` within the budget (default: the baseline's time, i.e. no slowdown: 1F1B
    all-max, or the order's own all-max time where that is later; for interleaved 1F1B and DualPipeV, that
    schedule's all-max time), in ``schedule``'s order (for
    EnvPipe's: the best of its warm-up counts and plain 1F1B, ``candidate_orders``).

    More budget never gives a dearer plan: the plan is the least-energy one on a ladder of budgets up to the
    budget (envpipe.plan.optimal.ladder). With the case's memory only orders that fit are tried (MemoryLimitError if
    none does), and the plan reports its per-stage peak bytes. The iteration, and so the budget, ends when every stage
    has finished its tail, as in envpipe.plan.simulate. ``time_limit_s``: a wall-clock limit on the search (off by
    default: then the same input always gives the same plan); the plan's notes say what it cut.
    """
    limit = TimeLimit(time_limit_s)
    baseline, problems = order_problems(case, schedule)
    budget = resolve_budget(baseline.iteration_time, time_budget_s, max_slowdown)
    search = OrderSearch(baseline, problems, limit)
    notes: tuple[str, ...] = ()
    if time_budget_s is None and max_slowdown is None and search.ladder.fastest_s > budget:
        # no budget given: no slowdown where the order can match the baseline; GPipe's all-max time can be
        # an ulp above 1F1B's (another order of the same sums), and then its own all-max time is the budget
        notes += (f"planned at the order's all-max time, {search.ladder.fastest_s:.12g} s "
                  f"({search.ladder.fastest_s - budget:.3g} s above the baseline's)",)
        budget = search.ladder.fastest_s
    found = search.within(budget)
    sol, problem = found.solution, found.problem
    plan = replace(plan_from_timeline(sol.timeline, problem.freqs_mhz(sol.option), schedule, "optimal", baseline),
                   peak_memory_bytes=problem.peak_memory_bytes)
    if sol.lp_energy is not None:
        notes += (f"LP lower bound for this order: {sol.lp_energy:.1f} J",)
    if found.budget_s < budget:
        notes += (f"planned for {found.budget_s:.6f} s: the least-energy rung of the budget ladder within the budget "
                  "(so more budget never gives a dearer plan)",)
    return Planned(plan, sol.timeline, baseline, found.reschedule, budget, found.tried, sol.lp_energy,
                   notes=notes + limit.note())

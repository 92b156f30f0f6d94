"""Single plans that never cost more for more time: the optimal planner's budgets on a ladder.

The search (envpipe.plan.optimal.solve.solve) rounds an LP solved at the budget, and two budgets round differently:
alone, it can give a longer budget a dearer plan (measured: GPT-3/A100, M = 96, 18.4645 s saved 26.759 % where
18.3006 s saved 26.816 %). So a single plan is chosen on a ladder of budgets that depends on the case only, never
on the budget asked: the rungs are the fastest iteration (every unit at its fastest clock) and the baseline time
times 1 + k/1000 within 10 % of it (k = ..., -1, 0, 1, ...), in steps of 1 % beyond (and everywhere on DAGs too
large for a whole LP, below). A budget gets the least-energy plan of every rung up to it. A larger budget sees
every rung a smaller one sees, so it never gets a dearer plan. A budget between two rungs is planned at the lower
one, at most a step less time; the baseline time and slowdowns in steps of 0.1 % are rungs themselves.

Only rungs that can win are searched. The LP's least energy is convex in the budget, so its tangent at a searched
rung bounds it at every lower rung from below, and no plan of a rung costs less than its LP: searching downwards
from the top rung, the first rung whose bound is no less than the best plan found ends the search. Where the whole
LP is too large to solve for a bound (more than BOUND_UNITS units), every rung from the baseline time up to the
budget is searched, the steps are 1 %, and between the fastest time and the baseline time there is no rung (such
budgets, tighter than the baseline's, get the all-fastest plan). Every budget also sees the all-fastest plan:
every unit at its fastest clock with its free float handed out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from envpipe.plan.optimal.timelimit import TimeLimit

FINE_SPAN = 100  # rungs of 0.1 % of the baseline time either side of it (10 %), then 1 %
# the whole LP (the bound) of 3,072 units takes about 0.6 s on the 2-core VM (measured 2026-11-28, 8 x 192)
BOUND_UNITS = 3072


class Candidate(Protocol):
    @property
    def energy(self) -> float: ...


C = TypeVar("C", bound=Candidate)
Bound = Callable[[float], float]  # a lower bound on any plan's energy at a budget at or below where it was made


@dataclass(frozen=True)
class Ladder:
    """The rungs of one case, from ``fastest_s`` (no plan is faster) to ``slowest_s`` (none is slower: every unit
    at its slowest useful clock), rung k at ``anchor_s`` times 1 + its offset."""

    fastest_s: float
    anchor_s: float  # the baseline time (the fastest, if that is longer): rung 0
    slowest_s: float
    fine: bool  # 0.1 % steps near the anchor (a whole LP's bound prunes the search), else 1 % steps everywhere

    def budget(self, k: int) -> float:
        """Rung k's budget, capped at the slowest time (more budget than that changes no plan)."""
        if not self.fine:
            offset = k / 100
        elif abs(k) <= FINE_SPAN:
            offset = k / 1000  # as resolve_budget computes a slowdown of k/1000: bit for bit
        else:
            offset = math.copysign(FINE_SPAN / 1000 + (abs(k) - FINE_SPAN) / 100, k)
        return min(self.anchor_s * (1 + offset), self.slowest_s)

    def nearest(self, budget_s: float) -> float:
        """The rung nearest ``budget_s`` (the fastest time or above)."""
        below = next(self.down_from(budget_s))
        above = min(next((r for r in self._up_from(below) if r > below), below), self.slowest_s)
        return above if above - budget_s < budget_s - below else below

    def _up_from(self, rung_s: float) -> Iterator[float]:
        k = 0
        while self.budget(k) > rung_s:
            k -= 1
        while self.budget(k) < self.slowest_s:
            k += 1
            yield self.budget(k)

    def down_from(self, budget_s: float) -> Iterator[float]:
        """The rungs to search at or below ``budget_s``, highest first. On a fine ladder the fastest time is the
        lowest; a coarse one (a large DAG: no bound prunes its search) has none between the fastest time and the
        anchor, whose budgets get the all-fastest plan, and searches the fastest time only as the anchor itself."""
        k = 0
        while self.budget(k) > budget_s and self.budget(k) > self.fastest_s:
            k -= 1
        while self.budget(k + 1) <= budget_s and self.budget(k) < self.slowest_s:
            k += 1
        while self.fastest_s < self.budget(k) <= budget_s and (self.fine or k >= 0):
            yield self.budget(k)
            k -= 1
        if self.fine or self.anchor_s <= self.fastest_s:
            yield self.fastest_s


class Rungs(Protocol[C]):
    """What the ladder searches: a case's ladder, the plan at any rung, the all-fastest plan and bounds."""

    ladder: Ladder
    limit: TimeLimit
    fastest: C  # every unit at its fastest clock, its float handed out

    def at(self, budget_s: float) -> C:
        """The plan searched at one rung."""
        ...

    def bound(self, budget_s: float) -> Bound | None:
        """A bound for the rungs below a searched rung, or None where there is none."""
        ...


def best_within(rungs: Rungs[C], budget_s: float, known: tuple[float, C, float] | None = None) -> tuple[C, float]:
    """The least-energy of ``rungs.fastest`` and ``rungs.at(b)`` at every rung b up to ``budget_s`` (at least the
    fastest time), searched downwards while a rung can still win (``rungs.bound(b)``); the plan and the rung it was
    planned at. On a tie the higher rung's plan is kept. ``known``: (a smaller budget, its answer and rung): the
    rungs up to that budget are not searched again (a frontier's sweep upwards)."""
    ladder, search, fastest, bound_at, limit = rungs.ladder, rungs.at, rungs.fastest, rungs.bound, rungs.limit
    best: C | None = None
    at = ladder.fastest_s
    bounds: list[Bound] = []
    unbounded: list[float] = []  # searched rungs whose bound is not yet made: made only when one is needed

    def can_win(rung: float, energy: float) -> bool:
        while True:
            if bounds and max(b(rung) for b in bounds) >= energy:
                return False  # and no rung below can either: the bounds only rise further down
            if not unbounded:
                return True
            bound = bound_at(unbounded.pop())
            if bound is None:
                unbounded.clear()  # none is to be had
                return True
            bounds.append(bound)

    for rung in ladder.down_from(budget_s):
        if known is not None and rung <= known[0]:
            if best is None or known[1].energy <= best.energy:
                best, at = known[1], known[2]
            break
        if best is not None:
            if not can_win(rung, best.energy):
                break
            if limit.up("plans for smaller budgets (the plan may cost more than one for a smaller budget)"):
                break
        found = search(rung)
        if best is None or found.energy < best.energy:
            best, at = found, rung
        unbounded.append(rung)
    if best is None or fastest.energy < best.energy:
        best, at = fastest, ladder.fastest_s
    return best, at

"""Lower bounds on what any unit order and clock plan of a pipeline can reach: the search prunes with them
before it runs the (expensive) optimal planner.

Time: stage s runs its 2M units, cannot start before the upstream stages have run one forward each, and
its last backward waits for the downstream stages' last backwards; then its tail. With every unit at its
fastest clock and transfers between stages:

    T >= max_s [ sum_{j<s} (f_j + x) + M (f_s + b_s) + sum_{j>s} (b_j + x) + tail_s ]

Energy: E = sum_u (e_u - P_idle t_u) + S P_idle T + (P_tail - P_idle) sum_s tail_s (envpipe.plan.optimal.menus;
the tails run at their own power). The second term is at least S P_idle T_lb. The first splits by stage;
stage s must fit its units into its window of the budget (the
budget less the same upstream, downstream and tail times), so its part is at least the continuous
relaxation of: choose a clock per unit, total time within the window, least total effective cost. That
relaxation is solved exactly by walking the lower convex hulls of the forward and backward menus from
their cheapest points toward faster ones, cheapest extra cost per second saved first.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from envpipe.plan.optimal.menus import Menu, pareto_menu
from envpipe.profile import Profile


class Bounded(Protocol):
    """What the bounds read of a pipeline (envpipe.search.evaluate.Pipeline)."""

    @property
    def profile(self) -> Profile: ...
    @property
    def microbatches(self) -> int: ...
    @property
    def transfer_s(self) -> float: ...
    @property
    def tail_s(self) -> np.ndarray: ...
    @property
    def idle_power_w(self) -> float: ...
    @property
    def tail_power_w(self) -> float: ...


def _fastest(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    return profile.fwd_time.min(axis=1), profile.bwd_time.min(axis=1)


def _outside(profile: Profile, transfer_s: float, tail_s: np.ndarray) -> np.ndarray:
    """(S,) time each stage cannot spend on its own units: upstream fill, downstream drain, tail."""
    f, b = _fastest(profile)
    up = np.r_[0.0, np.cumsum(f + transfer_s)[:-1]]
    down = np.r_[np.cumsum((b + transfer_s)[::-1])[::-1][1:], 0.0]
    return up + down + tail_s


def time_lower_bound(pipeline: Bounded) -> float:
    profile, microbatches = pipeline.profile, pipeline.microbatches
    f, b = _fastest(profile)
    return float(np.max(microbatches * (f + b) + _outside(profile, pipeline.transfer_s, pipeline.tail_s)))


def energy_lower_bound(pipeline: Bounded, budget_s: float) -> float:
    """One pipeline's least energy within ``budget_s`` (inf if some stage cannot fit its units in it)."""
    profile, microbatches, idle_power_w = pipeline.profile, pipeline.microbatches, pipeline.idle_power_w
    windows = budget_s - _outside(profile, pipeline.transfer_s, pipeline.tail_s)
    cost = 0.0
    for s, window in enumerate(windows):
        menus = (pareto_menu(profile.fwd_time[s], profile.fwd_energy[s], idle_power_w),
                 pareto_menu(profile.bwd_time[s], profile.bwd_energy[s], idle_power_w))
        cost += microbatches * _least_cost(menus, window / microbatches)
    T = time_lower_bound(pipeline)
    tails = float(np.sum(pipeline.tail_s)) * (pipeline.tail_power_w - idle_power_w)  # above the idle power
    return cost + profile.num_stages * idle_power_w * T + tails


def _least_cost(menus: tuple[Menu, ...], window: float) -> float:
    """Least sum of effective costs of one unit from each menu (fractional clocks allowed) whose times add
    up to at most ``window``; inf if even the fastest clocks do not fit."""
    hulls = [(m.time[m.hull], m.cost[m.hull]) for m in menus]  # time ascending, cost descending
    if sum(t[0] for t, _ in hulls) > window * (1 + 1e-12):
        return np.inf
    # start every menu at its cheapest (slowest hull) point, then buy back time on the cheapest segments
    total_time = sum(t[-1] for t, _ in hulls)
    total_cost = sum(c[-1] for _, c in hulls)
    segments = sorted((float((c[k] - c[k + 1]) / (t[k + 1] - t[k])), float(t[k + 1] - t[k]))
                      for t, c in hulls for k in range(t.size - 1))
    for price, seconds in segments:  # hull slopes rise toward faster points, so each menu goes in order
        excess = total_time - window
        if excess <= 0:
            break
        step = min(seconds, excess)
        total_time -= step
        total_cost += price * step
    return float(total_cost)

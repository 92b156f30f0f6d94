"""Per-(stage, kind) clock menus for the optimal planner: Pareto clocks and their lower convex hull.

With the unit order fixed, one iteration's energy (envpipe.plan.simulate) is

    E = sum_u e_u + sum_s P_s (T - busy_s) + sum_s (Q_s - P_s) tail_s
      = sum_u (e_u - P_s(u) t_u) + (sum_s P_s) T + sum_s (Q_s - P_s) tail_s,

with P_s the blocking power and Q_s the tail power of stage s. So each unit contributes an *effective cost*
c = e - P t, P its own stage's blocking power, that depends only on its own clock; the blocking powers
also enter through the makespan T, and the tails add a constant. A clock is useful only if no other clock is
both faster and cheaper (Pareto); the LP relaxation uses the lower convex hull of those.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from envpipe.plan.dag import PipelineDag
from envpipe.plan.simulate import Overheads, weighted_total
from envpipe.profile import Profile


@dataclass(frozen=True)
class Menu:
    """Useful clocks of one (stage, kind), sorted by time ascending (so cost descending)."""

    clock: np.ndarray  # (k,) indices into profile.freqs
    time: np.ndarray  # (k,) seconds
    cost: np.ndarray  # (k,) effective cost e - P*t, joules
    energy: np.ndarray  # (k,) joules
    hull: np.ndarray  # (h,) positions in the arrays above that are lower-hull vertices


def pareto_menu(time: np.ndarray, energy: np.ndarray, blocking_power_w: float) -> Menu:
    """The Pareto clocks of one (stage, kind) whose stage blocks at ``blocking_power_w``."""
    cost = energy - blocking_power_w * time
    order = np.lexsort((cost, time))  # time ascending, ties by cost
    keep: list[int] = []
    for k in order:
        if not keep or cost[k] < cost[keep[-1]] - 1e-12 * max(1.0, abs(cost[keep[-1]])):
            keep.append(int(k))
    idx = np.asarray(keep, dtype=int)
    t, c = time[idx], cost[idx]
    return Menu(idx, t, c, energy[idx], _lower_hull(t, c))


def _lower_hull(t: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Monotone-chain lower convex hull of points sorted by t (t strictly increasing)."""
    hull: list[int] = []
    for k in range(t.size):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b if it lies on or above the segment a -> k
            if (c[b] - c[a]) * (t[k] - t[a]) >= (c[k] - c[a]) * (t[b] - t[a]):
                hull.pop()
            else:
                break
        hull.append(k)
    return np.asarray(hull)


@dataclass(frozen=True)
class UnitMenus:
    """Menus of every unit of a DAG, padded into arrays indexed [unit, option] (time ascending).

    Padding is time = cost = inf (never fits a limit), so "options with time <= limit" is a prefix.
    """

    clock: np.ndarray  # (N, K) profile clock index
    time: np.ndarray  # (N, K)
    cost: np.ndarray  # (N, K)
    energy: np.ndarray  # (N, K) joules
    size: np.ndarray  # (N,) number of real options
    group: np.ndarray  # (N,) menu group 2*model stage + (0 for F, 1 for B)
    menus: tuple[Menu, ...]  # per group
    makespan_power_w: float  # sum of the stages' blocking powers: what a second more of iteration costs
    constant_j: float  # energy no clock changes: each tail's power above its stage's blocking power, x its time

    def pick(self, option: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per unit: profile clock index, time and energy of its option."""
        flat = self.row_offset + option  # one flat gather per table: quicker than [rows, option]
        return self.clock.ravel()[flat], self.time.ravel()[flat], self.energy.ravel()[flat]

    @cached_property
    def row_offset(self) -> np.ndarray:
        return np.arange(self.time.shape[0]) * self.time.shape[1]


def unit_menus(dag: PipelineDag, profile: Profile, overheads: Overheads) -> UnitMenus:
    """``profile``: one row per model stage of the DAG (envpipe.plan.layout.model_profile); each model stage
    blocks at the power of the pipeline stage that runs it."""
    if profile.num_stages != dag.num_stages * dag.num_chunks:
        raise ValueError(f"profile has {profile.num_stages} stages, the schedule {dag.num_stages * dag.num_chunks}")
    runs_on = np.empty(profile.num_stages, int)  # model stage -> pipeline stage
    runs_on[dag.model_stage] = dag.stage
    power = overheads.blocking_power_w[runs_on]
    menus = []
    for s in range(profile.num_stages):
        menus.append(pareto_menu(profile.fwd_time[s], profile.fwd_energy[s], power[s]))
        menus.append(pareto_menu(profile.bwd_time[s], profile.bwd_energy[s], power[s]))
    width = max(m.clock.size for m in menus)
    pad = lambda a, fill: np.r_[a, np.full(width - a.size, fill)]  # noqa: E731
    g_clock = np.stack([pad(m.clock, 0) for m in menus]).astype(int)
    g_time = np.stack([pad(m.time, np.inf) for m in menus])
    g_cost = np.stack([pad(m.cost, np.inf) for m in menus])
    g_energy = np.stack([pad(m.energy, np.inf) for m in menus])
    group = 2 * dag.model_stage + (~dag.is_fwd).astype(int)
    sizes = np.asarray([m.clock.size for m in menus])
    blocking = overheads.blocking_power_w
    return UnitMenus(g_clock[group], g_time[group], g_cost[group], g_energy[group], sizes[group], group,
                     tuple(menus), weighted_total(np.ones(dag.num_stages), blocking),
                     weighted_total(overheads.tail_s, overheads.tail_power_w - blocking))

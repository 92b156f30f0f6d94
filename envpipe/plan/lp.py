"""The time-cost trade-off on the iteration DAG as a linear program (HiGHS via scipy, sparse).

Variables: start s_u per unit, the makespan T, and per unit and segment j of its convex cost hull
the time delta_uj taken from that segment (duration d_u = fastest time + sum_j delta_uj, cost =
fastest cost + sum_j slope_j delta_uj). Constraints: every DAG edge p -> u (s_p + d_p + lag <= s_u,
lag = transfer time on cross-stage edges) and every stage's last unit plus the stage's tail ends
by T <= budget. Minimising
sum of costs + S*P*T (the iteration energy, see menus.py) gives
the LP relaxation of the discrete problem: a lower bound on the energy of any plan within the
budget, and durations that envpipe.plan.optimal rounds to real clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from envpipe.plan.dag import PipelineDag
from envpipe.plan.menus import UnitMenus
from envpipe.plan.simulate import stage_tails

_IPM_FROM_UNITS = 3000


class InfeasibleBudget(ValueError):
    """No clock assignment meets the time budget (it is tighter than every unit at its fastest clock)."""


@dataclass(frozen=True)
class Edges:
    pred: np.ndarray  # (E,) unit that must finish first
    succ: np.ndarray  # (E,) unit that waits
    lag: np.ndarray  # (E,) seconds between them (transfer on cross-stage edges)
    last: np.ndarray  # (S,) each stage's last unit: it and the stage's tail bound the makespan (covers every sink)
    tail: np.ndarray  # (S,) seconds each stage works after its last unit (all-reduce, optimizer step)


def dag_edges(dag: PipelineDag, transfer_s: float, tail_s: float | np.ndarray = 0.0) -> Edges:
    N = dag.num_units
    units = np.arange(N)
    has_same, has_data = dag.pred_same != N, dag.pred_data != N
    pred = np.r_[dag.pred_same[has_same], dag.pred_data[has_data]]
    succ = np.r_[units[has_same], units[has_data]]
    lag = np.r_[np.zeros(has_same.sum()), np.where(dag.data_crosses[has_data], transfer_s, 0.0)]
    last = np.asarray([ids[-1] for ids in dag.order])
    return Edges(pred, succ, lag, last, stage_tails(tail_s, dag.num_stages))


def timing_rows(edges: Edges, num_units: int) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Rows over [s (N), d (N), T]: precedence s_p + d_p - s_u <= -lag and, per stage, the end of its
    last unit plus its tail by the makespan: s_u + d_u - T <= -tail (the simulator's iteration end)."""
    N, E, K = num_units, edges.pred.size, edges.last.size
    r_e = np.arange(E)
    r_k = E + np.arange(K)
    rows = np.r_[r_e, r_e, r_e, r_k, r_k, r_k]
    cols = np.r_[edges.pred, N + edges.pred, edges.succ, edges.last, N + edges.last, np.full(K, 2 * N)]
    vals = np.r_[np.ones(E), np.ones(E), -np.ones(E), np.ones(K), np.ones(K), -np.ones(K)]
    A = sparse.csr_matrix((vals, (rows, cols)), shape=(E + K, 2 * N + 1))
    return A, np.r_[-edges.lag, -edges.tail]


@dataclass(frozen=True)
class Relaxation:
    duration: np.ndarray  # (N,) LP durations, between the fastest and slowest hull clock
    energy: float  # lower bound on the iteration energy of any plan of this order within the budget


def solve_relaxation(dag: PipelineDag, menus: UnitMenus, edges: Edges, budget_s: float,
                     idle_power_w: float, max_segments: int | None = None) -> Relaxation:
    N = dag.num_units
    # d_u = fastest hull time + sum_j delta_uj, 0 <= delta_uj <= length of hull segment j, cost slope a_j.
    # The hull is convex (slopes increase), so the LP fills cheaper segments first on its own: no
    # epigraph rows, only bounded columns, which keeps the simplex small.
    seg_unit, seg_len, seg_slope = [], [], []
    for g, menu in enumerate(menus.menus):
        hull = menu.hull if max_segments is None else _thin(menu.hull, max_segments)
        t, c = menu.time[hull], menu.cost[hull]
        if t.size < 2:
            continue
        units = np.flatnonzero(menus.group == g)
        seg_unit.append(np.repeat(units, t.size - 1))
        seg_len.append(np.tile(np.diff(t), units.size))
        seg_slope.append(np.tile(np.diff(c) / np.diff(t), units.size))
    su = np.concatenate(seg_unit) if seg_unit else np.zeros(0, int)
    length = np.concatenate(seg_len) if seg_len else np.zeros(0)
    slope = np.concatenate(seg_slope) if seg_slope else np.zeros(0)
    D = su.size
    fastest = np.asarray([m.time[m.hull[0]] for m in menus.menus])[menus.group]
    fast_cost = np.asarray([m.cost[m.hull[0]] for m in menus.menus])[menus.group]

    A_t, ub_t = timing_rows(edges, N)
    A_t = A_t.tocsc()
    to_units = sparse.csr_matrix((np.ones(D), (su, np.arange(D))), shape=(N, D))
    A_d = A_t[:, N:2 * N]
    A = sparse.hstack([A_t[:, :N], A_t[:, 2 * N:], A_d @ to_units], format="csr")  # columns [s, T, delta]
    ub = ub_t - A_d @ fastest
    objective = np.r_[np.zeros(N), dag.num_stages * idle_power_w, slope]
    lb = np.zeros(N + 1 + D)
    hi = np.r_[np.full(N, np.inf), budget_s, length]
    # dual simplex is quicker on small DAGs, the interior-point method scales better on large ones
    method = "highs-ds" if N <= _IPM_FROM_UNITS else "highs-ipm"
    res = linprog(objective, A_ub=A, b_ub=ub, bounds=np.c_[lb, hi], method=method)
    if res.status == 2:
        raise InfeasibleBudget(f"time budget {budget_s:.6f} s is infeasible: even every unit at its fastest "
                               "clock takes longer")
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"LP relaxation failed: {res.message}")
    duration = fastest + np.bincount(su, weights=res.x[N + 1:], minlength=N)
    return Relaxation(duration, float(res.fun + fast_cost.sum()))


def _thin(hull: np.ndarray, max_segments: int) -> np.ndarray:
    """At most ``max_segments`` segments: evenly spaced hull vertices (still convex, still a lower bound's
    upper approximation), so large LPs stay small; rounding and improvement use the full menus."""
    if hull.size <= max_segments + 1:
        return hull
    keep = np.unique(np.linspace(0, hull.size - 1, max_segments + 1).round().astype(int))
    return hull[keep]

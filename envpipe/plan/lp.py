"""The time-cost trade-off on the iteration DAG as a linear program (HiGHS via scipy, sparse).

Variables: start s_u, duration d_u and cost z_u per unit, and the makespan T. Constraints: every
DAG edge p -> u (s_p + d_p + lag <= s_u, lag = transfer time on cross-stage edges), every sink ends
by T (s_u + d_u <= T <= budget), and z_u lies on or above each segment of the unit's convex cost
hull (z_u >= a_j d_u + b_j). Minimising sum z_u + S*P*T (the iteration energy, see menus.py) gives
the LP relaxation of the discrete problem: a lower bound on the energy of any plan within the
budget, and durations that envpipe.plan.optimal rounds to real clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from envpipe.plan.dag import PipelineDag
from envpipe.plan.menus import UnitMenus


class InfeasibleBudget(ValueError):
    """No clock assignment meets the time budget (it is tighter than every unit at its fastest clock)."""


@dataclass(frozen=True)
class Edges:
    pred: np.ndarray  # (E,) unit that must finish first
    succ: np.ndarray  # (E,) unit that waits
    lag: np.ndarray  # (E,) seconds between them (transfer on cross-stage edges)
    sinks: np.ndarray  # units with no successor: they bound the makespan


def dag_edges(dag: PipelineDag, transfer_s: float) -> Edges:
    N = dag.num_units
    units = np.arange(N)
    has_same, has_data = dag.pred_same != N, dag.pred_data != N
    pred = np.r_[dag.pred_same[has_same], dag.pred_data[has_data]]
    succ = np.r_[units[has_same], units[has_data]]
    lag = np.r_[np.zeros(has_same.sum()), np.where(dag.data_crosses[has_data], transfer_s, 0.0)]
    sinks = np.setdiff1d(units, pred)
    return Edges(pred, succ, lag, sinks)


def timing_rows(edges: Edges, num_units: int) -> tuple[sparse.csr_matrix, np.ndarray]:
    """Rows over [s (N), d (N), T]: precedence s_p + d_p - s_u <= -lag and makespan s_u + d_u - T <= 0."""
    N, E, K = num_units, edges.pred.size, edges.sinks.size
    r_e = np.arange(E)
    r_k = E + np.arange(K)
    rows = np.r_[r_e, r_e, r_e, r_k, r_k, r_k]
    cols = np.r_[edges.pred, N + edges.pred, edges.succ, edges.sinks, N + edges.sinks, np.full(K, 2 * N)]
    vals = np.r_[np.ones(E), np.ones(E), -np.ones(E), np.ones(K), np.ones(K), -np.ones(K)]
    A = sparse.csr_matrix((vals, (rows, cols)), shape=(E + K, 2 * N + 1))
    return A, np.r_[-edges.lag, np.zeros(K)]


@dataclass(frozen=True)
class Relaxation:
    duration: np.ndarray  # (N,) LP durations, between the fastest and slowest hull clock
    energy: float  # lower bound on the iteration energy of any plan of this order within the budget


def solve_relaxation(dag: PipelineDag, menus: UnitMenus, edges: Edges, budget_s: float,
                     idle_power_w: float) -> Relaxation:
    N = dag.num_units
    A_t, ub_t = timing_rows(edges, N)
    # hull segments of every unit: z_u >= a d_u + b  <=>  a d_u - z_u <= -b   (z_u is column 2N+1+u)
    seg_unit, seg_a, seg_b = [], [], []
    for g, menu in enumerate(menus.menus):
        h = menu.hull
        if h.size < 2:
            continue
        t, c = menu.time[h], menu.cost[h]
        a = np.diff(c) / np.diff(t)
        b = c[:-1] - a * t[:-1]
        units = np.flatnonzero(menus.group == g)
        seg_unit.append(np.repeat(units, a.size))
        seg_a.append(np.tile(a, units.size))
        seg_b.append(np.tile(b, units.size))
    width = 3 * N + 1
    blocks = [sparse.hstack([A_t, sparse.csr_matrix((A_t.shape[0], N))])]
    ub = [ub_t]
    if seg_unit:
        su, sa, sb = np.concatenate(seg_unit), np.concatenate(seg_a), np.concatenate(seg_b)
        r = np.arange(su.size)
        cols = np.r_[N + su, 2 * N + 1 + su]
        blocks.append(sparse.csr_matrix((np.r_[sa, -np.ones(su.size)], (np.r_[r, r], cols)), shape=(su.size, width)))
        ub.append(-sb)
    A = sparse.vstack(blocks, format="csr")
    hull_t = [(m.time[m.hull[0]], m.time[m.hull[-1]], m.cost[m.hull[-1]]) for m in menus.menus]
    t_lo, t_hi, c_lo = (np.asarray(v)[menus.group] for v in zip(*hull_t, strict=True))
    lb = np.r_[np.zeros(N), t_lo, 0.0, c_lo]
    hi = np.r_[np.full(N, np.inf), t_hi, budget_s, np.full(N, np.inf)]
    objective = np.r_[np.zeros(2 * N), dag.num_stages * idle_power_w, np.ones(N)]
    res = milp(objective, constraints=LinearConstraint(A, -np.inf, np.concatenate(ub)), bounds=Bounds(lb, hi))
    if res.status == 2:
        raise InfeasibleBudget(f"time budget {budget_s:.6f} s is infeasible: even every unit at its fastest "
                               "clock takes longer")
    if res.x is None:
        raise RuntimeError(f"LP relaxation failed: {res.message}")
    return Relaxation(res.x[N:2 * N], float(res.fun))

"""The time-cost trade-off on the iteration DAG as a linear program (HiGHS via scipy, sparse).

Variables: start s_u per unit, the makespan T, and per unit and segment j of its convex cost hull
the time delta_uj taken from that segment (duration d_u = fastest time + sum_j delta_uj, cost =
fastest cost + sum_j slope_j delta_uj). Constraints: every DAG edge p -> u (s_p + d_p + lag <= s_u,
lag = transfer time on cross-stage edges) and every stage's last unit plus the stage's tail ends
by T <= budget. Minimising sum of costs + (sum_s P_s) T (the iteration energy less a constant, see
menus.py) gives the LP relaxation of the discrete problem: a lower bound on the energy of any plan within the
budget, and durations that envpipe.plan.optimal rounds to real clocks.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import OptimizeWarning, linprog

from envpipe.plan.dag import PipelineDag
from envpipe.plan.optimal.fold import Fold, identity_fold
from envpipe.plan.optimal.menus import UnitMenus
from envpipe.plan.simulate import per_stage

# linprog hands HiGHS the options it has no name for itself verbatim, warning each time; this module's one such option
# (the coarse LP's scaling, below) is meant
warnings.filterwarnings("ignore", r"Unrecognized options detected: \{'simplex_scale_strategy': \d+\}\.",
                        OptimizeWarning)


class InfeasibleBudget(ValueError):
    """No clock assignment meets the time budget (it is tighter than every unit at its fastest clock)."""


class RelaxationStopped(RuntimeError):
    """The user's time limit stopped HiGHS before the LP was solved."""


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
    return Edges(pred, succ, lag, last, per_stage(tail_s, dag.num_stages, "tail times"))


@dataclass(frozen=True)
class Relaxation:
    duration: np.ndarray  # (N,) LP durations, between the fastest and slowest hull clock
    end: np.ndarray  # (N,) when each unit ends in the LP's schedule (a schedule of the full DAG within the budget)
    energy: float  # the LP's least iteration energy: a lower bound on any plan of this order unless folded
    folded: bool  # solved on a periodic fold (envpipe.plan.optimal.fold): a restriction, so `energy` is no bound
    budget_price: float  # joules the LP's energy falls per second more budget (its dual price, >= 0)

    def bound_at(self, budget_s: float, solved_at_s: float) -> float:
        """A lower bound on the LP's energy at a smaller budget: the LP's value is convex in the budget, so its
        tangent at the budget it was solved at (``solved_at_s``) lies below it everywhere (unfolded, full hull
        only; less HiGHS's relative tolerance)."""
        return (self.energy + self.budget_price * (solved_at_s - budget_s)) * (1 - 1e-6) - 1e-9


def solve_relaxation(menus: UnitMenus, edges: Edges, budget_s: float, fold: Fold | None = None,
                     max_segments: int | None = None, time_limit_s: float | None = None,
                     unfold: bool = True) -> Relaxation:
    """The LP on the DAG of ``menus`` and ``edges``, or on ``fold`` of it (falling back to the full LP if the
    fold has no solution, unless ``unfold`` is False: then InfeasibleBudget); ``max_segments``: at most that many
    hull segments per menu (large DAGs); ``time_limit_s``: the user's wall-clock limit only (RelaxationStopped
    when it stops HiGHS)."""
    if fold is not None and not fold.is_identity:
        try:
            return _solve(menus, edges, budget_s, fold, max_segments, time_limit_s)
        except InfeasibleBudget:
            if not unfold:
                raise
            # the budget leaves no room for a periodic middle: the full LP decides
    return _solve(menus, edges, budget_s, identity_fold(menus.time.shape[0]), max_segments, time_limit_s)


def _solve(menus: UnitMenus, edges: Edges, budget_s: float, fold: Fold, max_segments: int | None,
           time_limit_s: float | None) -> Relaxation:
    R = fold.size
    # d_r = fastest hull time + sum_j delta_rj, 0 <= delta_rj <= length of hull segment j, cost slope a_j
    # (times the number of units sharing r). The hull is convex (slopes increase), so the LP fills cheaper
    # segments first on its own: no epigraph rows, only bounded columns, which keeps the simplex small.
    group = menus.group[fold.unit]
    weight = fold.weight
    seg_unit, seg_len, seg_slope = [], [], []
    for g, menu in enumerate(menus.menus):
        hull = menu.hull if max_segments is None else _thin(menu.hull, max_segments)
        t, c = menu.time[hull], menu.cost[hull]
        if t.size < 2:
            continue
        units = np.flatnonzero(group == g)
        seg_unit.append(np.repeat(units, t.size - 1))
        seg_len.append(np.tile(np.diff(t), units.size))
        seg_slope.append(np.tile(np.diff(c) / np.diff(t), units.size))
    su = np.concatenate(seg_unit) if seg_unit else np.zeros(0, int)
    length = np.concatenate(seg_len) if seg_len else np.zeros(0)
    slope = np.concatenate(seg_slope) * weight[su] if seg_slope else np.zeros(0)
    D = su.size
    fastest = np.asarray([m.time[m.hull[0]] for m in menus.menus])[group]
    fast_cost = np.asarray([m.cost[m.hull[0]] for m in menus.menus])[group]

    A_t, ub_t = timing_rows(edges, fold)
    P = fold.num_periods
    to_units = sparse.csr_matrix((np.ones(D), (su, np.arange(D))), shape=(R, D))
    A_d = A_t[:, R:2 * R]
    A = sparse.hstack([A_t[:, :R], A_t[:, 2 * R:], A_d @ to_units], format="csr")  # columns [s, T, tau (P), delta]
    ub = ub_t - A_d @ fastest
    objective = np.r_[np.zeros(R), menus.makespan_power_w, np.zeros(P), slope]
    lb = np.zeros(R + 1 + P + D)
    hi = np.r_[np.full(R, np.inf), budget_s, np.full(P, np.inf), length]
    # dual simplex: measured 2026-11-28 on the 2-core VM it beats the interior-point method at every size tried
    # (16,384 units unfolded 3.6 s against 8.0 s, 32,768 unfolded 10 s against 36 s, 64 x 1,024 folded 6.5 s
    # against 7.3 s)
    method = "highs-ds"
    options: dict[str, object] = {} if time_limit_s is None else {"time_limit": time_limit_s}
    if max_segments is not None:
        # a large DAG's coarse LP: devex pricing instead of HiGHS's default, measured 2026-11-28 on 64 x 1,024 (the
        # same LP values): EnvPipe's order 19.2 s against 23.1 s, 1F1B's 7.4 s against 8.5 s; small DAGs keep theirs
        options["simplex_dual_edge_weight_strategy"] = "devex"
        # and scaling by powers of two to a largest value of 1 (HiGHS's strategy 4) instead of its equilibration:
        # fewer simplex iterations, measured 2026-11-29 on the 2-core VM, 64 x 1,024 (the same LP values): EnvPipe's
        # order 61,694 against 75,576 (GPT-3/A100) and 58,131 against 72,009 (BLOOM/A40), 1F1B's 40,603 against
        # 40,546 and 42,394 against 49,393
        options["simplex_scale_strategy"] = 4
    res = linprog(objective, A_ub=A, b_ub=ub, bounds=np.c_[lb, hi], method=method, options=options)
    if res.status == 1 and time_limit_s is not None:
        raise RelaxationStopped(f"LP relaxation stopped: {res.message}")
    if res.status == 2:
        raise InfeasibleBudget(f"time budget {budget_s:.12g} s is infeasible: even every unit at its fastest "
                               "clock takes longer")
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"LP relaxation failed: {res.message}")
    duration = fastest + np.bincount(su, weights=res.x[R + 1 + P:], minlength=R)
    # a folded unit starts ``shift`` periods of its stage after its representative
    end = res.x[:R][fold.rep] + fold.shift * res.x[R + 1:R + 1 + P][fold.clock_of] + duration[fold.rep]
    return Relaxation(duration[fold.rep], end, float(res.fun + fast_cost @ weight) + menus.constant_j,
                      not fold.is_identity, max(0.0, -float(res.upper.marginals[R])))


def timing_rows(edges: Edges, fold: Fold) -> tuple[sparse.csc_matrix, np.ndarray]:
    """Rows over [s (R), d (R), T, tau (fold.num_periods)] of the folded units.

    Precedence s_p + d_p - s_u <= -lag. A folded unit starts at its representative's start plus ``shift``
    periods, so an edge reads s_p' + d_p' - s_u' + k_p tau_a - k_u tau_b <= -lag; along a family of edges
    that differ only in k_p (the same representatives, periods, k_u - k_p and lag) the row is affine
    in k_p, so the rows of its smallest and largest k_p imply all others. Per stage, the end of its last unit
    plus its tail by the makespan: s_u + d_u - T <= -tail (the simulator's iteration end). Unfolded (identity
    fold), every shift is 0 and tau has no entries."""
    R, stage = fold.size, fold.clock_of
    kp, ku = fold.shift[edges.pred], fold.shift[edges.succ]
    family = np.c_[fold.rep[edges.pred], fold.rep[edges.succ], stage[edges.pred], stage[edges.succ], ku - kp,
                   edges.lag]
    by_family = np.lexsort((kp, *family.T[::-1]))
    starts = np.r_[True, np.any(np.diff(family[by_family], axis=0) != 0, axis=1)]
    keep = np.unique(np.r_[by_family[starts], by_family[np.r_[starts[1:], True]]])
    rp, ru, a, b, lag = (family[keep, i] for i in (0, 1, 2, 3, 5))
    rp, ru, a, b = (x.astype(int) for x in (rp, ru, a, b))
    kp, ku = kp[keep], ku[keep]
    E, K = keep.size, edges.last.size
    rl, kl, sl = fold.rep[edges.last], fold.shift[edges.last], stage[edges.last]
    r_e, r_k = np.arange(E), E + np.arange(K)
    T, tau = 2 * R, 2 * R + 1
    rows = np.r_[r_e, r_e, r_e, r_e, r_e, r_k, r_k, r_k, r_k]
    cols = np.r_[rp, R + rp, ru, tau + a, tau + b, rl, R + rl, np.full(K, T), tau + sl]
    vals = np.r_[np.ones(E), np.ones(E), -np.ones(E), kp, -ku, np.ones(K), np.ones(K), -np.ones(K), kl]
    A = sparse.csc_matrix((vals, (rows, cols)), shape=(E + K, 2 * R + 1 + fold.num_periods))
    return A, np.r_[-lag, -edges.tail]


def _thin(hull: np.ndarray, max_segments: int) -> np.ndarray:
    """At most ``max_segments`` segments: evenly spaced hull vertices (still convex, still a lower bound's
    upper approximation), so large LPs stay small; rounding and improvement use the full menus."""
    if hull.size <= max_segments + 1:
        return hull
    keep = np.unique(np.linspace(0, hull.size - 1, max_segments + 1).round().astype(int))
    return hull[keep]

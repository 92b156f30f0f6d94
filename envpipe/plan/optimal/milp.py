"""Exact reference: the discrete clock choice as a MILP (scipy.optimize.milp / HiGHS).

One binary x_uk per unit and Pareto clock (sum_k x_uk = 1), start times s_u, duration
d_u = sum_k t_uk x_uk in the precedence and makespan rows, objective sum_uk c_uk x_uk + (sum_s P_s) T (the
iteration energy less a constant, see menus.py). It is exact but exponential in the worst case, so it is an
oracle for small instances (tests), and, restricted to a neighbourhood, the planner's polish.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from envpipe.plan.optimal.fold import identity_fold
from envpipe.plan.optimal.lp import Edges, InfeasibleBudget, timing_rows
from envpipe.plan.optimal.menus import UnitMenus
from envpipe.quiet import native_output_silenced


class MilpUnsolved(RuntimeError):
    """HiGHS stopped at a limit (its node limit, or the user's time limit) without the solution asked for."""


@dataclass(frozen=True)
class Neighbourhood:
    """A restricted MILP (a large-neighbourhood search): only the ``allowed`` (N, K) options, at most
    ``node_limit`` branch-and-bound nodes; the best solution found is returned."""

    allowed: np.ndarray
    node_limit: int


def solve_milp(menus: UnitMenus, edges: Edges, budget_s: float, node_limit: int | None = None,
               within: Neighbourhood | None = None, time_limit_s: float | None = None) -> tuple[np.ndarray, float]:
    """Optimal menu option per unit of the DAG of ``menus`` and ``edges`` and the least iteration energy.

    Limits are counts of branch-and-bound nodes (``node_limit``, or the neighbourhood's), so the answer does not
    depend on the machine's speed or load; ``time_limit_s`` is only the user's own wall-clock limit (off by
    default). With ``within`` the best solution found is returned; MilpUnsolved is raised if a limit stopped
    HiGHS without one (or, without ``within``, before it proved the optimum).
    """
    N = menus.time.shape[0]
    K = menus.time.shape[1]
    real = np.arange(K)[None, :] < menus.size[:, None]  # (N, K) real (not padded) options
    if within is not None:
        real &= within.allowed
    xu, xk = np.nonzero(real)
    X = xu.size
    A_t, ub_t = timing_rows(edges, identity_fold(N))
    # columns [s (N), T, x (X)]; substitute d_u = sum_k t_uk x_uk into the timing rows
    A_s, A_d, A_T = A_t[:, :N], A_t[:, N:2 * N], A_t[:, 2 * N:2 * N + 1]  # tau: no entries unfolded
    A_x = A_d[:, xu] @ sparse.diags(menus.time[xu, xk])
    timing = sparse.hstack([A_s, A_T, A_x], format="csr")
    one_hot = sparse.csr_matrix((np.ones(X), (xu, N + 1 + np.arange(X))), shape=(N, N + 1 + X))
    A = sparse.vstack([timing, one_hot], format="csr")
    lo = np.r_[np.full(timing.shape[0], -np.inf), np.ones(N)]
    hi = np.r_[ub_t, np.ones(N)]
    objective = np.r_[np.zeros(N), menus.makespan_power_w, menus.cost[xu, xk]]
    integrality = np.r_[np.zeros(N + 1), np.ones(X)]
    bounds = Bounds(np.zeros(N + 1 + X), np.r_[np.full(N, np.inf), budget_s, np.ones(X)])
    nodes = node_limit if within is None else within.node_limit
    options: dict[str, float] = {"mip_rel_gap": 1e-9}
    if nodes is not None:
        options["node_limit"] = nodes
    if time_limit_s is not None:
        options["time_limit"] = time_limit_s
    with native_output_silenced():  # HiGHS's C++ debug lines (`HighsMipSolverData::...`) go to stdout otherwise
        res = milp(objective, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=bounds,
                   options=options)
    if res.status == 2:
        raise InfeasibleBudget(f"time budget {budget_s:.12g} s is infeasible")
    if res.x is None:
        raise MilpUnsolved(f"MILP found no solution: {res.message}")
    if res.status != 0 and within is None:
        raise MilpUnsolved(f"MILP not solved to optimality: {res.message}")
    option = np.zeros(N, int)
    chosen = res.x[N + 1:] > 0.5
    option[xu[chosen]] = xk[chosen]
    return option, float(res.fun) + menus.constant_j

"""Planner instances from the measured profiles shipped in envpipe/profile/data, and the exact reference.

Whole profiles, cut down to some stages and clocks, or drawn at random; each with Perseus's blocking power
for its GPU. `exact_energy` is the exact MILP's least energy over every order the optimal planner considers:
what its tests and benchmarks/planner_study/optimal.py check it against, on the same kind of instance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.plan.case import PipelineCase
from envpipe.plan.optimal.lp import InfeasibleBudget
from envpipe.plan.optimal.milp import solve_milp
from envpipe.plan.optimal.problem import build_problem, candidate_orders
from envpipe.profile import Profile, embedded_profile_path, load_profile
from envpipe.profile.gpus import EMBEDDED_GPUS, IDLE_POWER_W

# name -> Perseus's blocking power (W) of the GPU the profile was measured on
BLOCKING_POWER_W: dict[str, float] = {name: IDLE_POWER_W[gpu] for name, gpu in EMBEDDED_GPUS.items()}


def real_profile(name: str) -> Profile:
    return load_profile(embedded_profile_path(name))


def cut_down(prof: Profile, stages: list[int] | np.ndarray, clocks: list[int] | np.ndarray) -> Profile:
    """The measured rows of some stages (in pipeline order) at some clocks (indices into prof.freqs)."""
    s = np.asarray(stages)
    sub = Profile(prof.freqs, prof.fwd_time[s], prof.bwd_time[s], prof.fwd_energy[s], prof.bwd_energy[s],
                  prof.source)
    return sub.restricted(prof.freqs[np.asarray(clocks)])


def spread_clocks(prof: Profile, count: int) -> np.ndarray:
    """``count`` clock indices spread evenly over the profile's range (the highest always included)."""
    return np.linspace(0, prof.freqs.size - 1, count).round().astype(int)


@dataclass(frozen=True)
class Case:
    name: str
    stages: list[int]
    profile: Profile
    watts: float
    microbatches: int
    slowdown: float
    schedule: str

    def __str__(self) -> str:
        return (f"{self.name} stages {self.stages} x {self.profile.freqs.size} clocks, M={self.microbatches}, "
                f"slowdown {self.slowdown:.3f}, {self.schedule}")

    @property
    def case(self) -> PipelineCase:
        return PipelineCase.of(self.profile, self.microbatches, self.watts)


def random_case(seed: int) -> Case:
    """A random small cut-down: 2-4 stages (any subset, pipeline order kept), 4-8 clocks (the highest
    always, as the baseline needs it), M in {4, 6, 8}, slowdown 0 or 0-10%, 1F1B or EnvPipe's schedule."""
    rng = np.random.default_rng(seed)
    name = str(rng.choice(sorted(BLOCKING_POWER_W)))
    full = real_profile(name)
    stages = np.sort(rng.choice(full.num_stages, int(rng.integers(2, 5)), replace=False))
    clocks = np.unique(np.r_[0, rng.choice(np.arange(1, full.freqs.size), int(rng.integers(3, 8)), replace=False)])
    slowdown = float(rng.choice([0.0, round(float(rng.uniform(0, 0.1)), 3)]))
    return Case(name, stages.tolist(), cut_down(full, stages, clocks), BLOCKING_POWER_W[name],
                int(rng.choice([4, 6, 8])), slowdown, str(rng.choice(["1f1b", "envpipe"])))


def exact_energies(case: PipelineCase, schedule: str, budget_s: float, node_limit: int | None = None
                   ) -> dict[tuple[int, ...], float]:
    """Least energy within the budget for each order the planner considers (keyed by its r_s), by the exact
    MILP, simulated; orders with no plan within the budget are left out. ``node_limit``: branch-and-bound nodes
    per order before MilpUnsolved (default: none; the test instances solve in well under a second)."""
    energies: dict[tuple[int, ...], float] = {}
    for r in candidate_orders(case, schedule):
        problem = build_problem(case, schedule, r)
        try:
            option, value = solve_milp(problem.menus, problem.edges, budget_s, node_limit)
        except InfeasibleBudget:
            continue
        tl = problem.simulate(option)
        if tl.iteration_time > budget_s * (1 + 1e-6) or abs(tl.energy - value) > 1e-6 * tl.energy:
            raise AssertionError(f"the MILP's plan does not simulate to its own value for order {list(r)}")
        energies[tuple(r)] = tl.energy
    return energies


def exact_energy(case: PipelineCase, schedule: str, budget_s: float, node_limit: int | None = None) -> float:
    """Least energy within the budget over every order the planner considers, by the exact MILP."""
    return float(min(exact_energies(case, schedule, budget_s, node_limit).values(), default=np.inf))

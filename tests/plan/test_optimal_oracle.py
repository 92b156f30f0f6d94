"""The optimal planner against exact references on random cut-downs of four real measured profiles:
the MILP optimum (within 0.5% of its saving), the LP bound, and every EnvPipe policy at its own time."""

from __future__ import annotations

import numpy as np
import pytest

from envpipe.plan.optimal import optimal_plan
from envpipe.plan.planfile import evaluate_plan
from envpipe.plan.planner import make_plan
from envpipe.plan.policies import POLICIES
from envpipe.plan.reconfig import RECONFIGS

from .optimal_cases import REAL, cut_down, milp_energies, milp_energy, random_case, real_profile, spread_clocks

# seeds of random_case(): both schedules, all four profiles, 2-4 stages, M 4-8, 0-8% slowdown; each MILP
# solves in well under a second (benchmarks/bench_optimal.py runs many more)
SEEDS = [0, 3, 5, 9, 12, 13, 20, 21, 24, 30, 33, 36, 39]


def relative_gap(ours: float, exact: float, baseline: float) -> float:
    """How much of the exact optimum's saving the planner misses (0: none)."""
    return ((baseline - exact) - (baseline - ours)) / max(baseline - exact, 1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_within_half_a_percent_of_the_milp_saving(seed):
    case = random_case(seed)
    res = optimal_plan(case.profile, case.microbatches, idle_power_w=case.watts, schedule=case.schedule,
                       max_slowdown=case.slowdown)
    energies = milp_energies(case.profile, case.microbatches, case.schedule, case.watts, res.budget_s)
    exact = min(energies.values())
    again = evaluate_plan(res.plan, case.profile, case.watts)  # the claim, re-simulated
    assert again.energy == pytest.approx(res.timeline.energy, rel=1e-12)
    assert again.iteration_time <= res.budget_s * (1 + 1e-9)
    assert relative_gap(again.energy, exact, res.baseline.energy) <= 0.005, str(case)
    # the LP value of the chosen order bounds that order's MILP optimum from below
    assert res.lp_energy is not None
    assert res.lp_energy <= energies[tuple(res.reschedule)] * (1 + 1e-7)


@pytest.mark.parametrize(("name", "slowdown"), [(name, 0.0) for name in sorted(REAL)] + [
    ("gpt3-175b+a100_sxm_bf16", 0.03), ("bloom+a40_bf16", 0.03), ("bloom+a100_sxm_bf16", 0.03)])
def test_4x8x8_cut_downs_match_milp(name, slowdown):
    """The issue's example size: 4 stages x 8 micro-batches x 8 clocks, plain 1F1B."""
    prof = real_profile(name)
    prof = cut_down(prof, [0, 1, 2, 3], spread_clocks(prof, 8))
    watts = REAL[name][1]
    res = optimal_plan(prof, 8, idle_power_w=watts, schedule="1f1b", max_slowdown=slowdown)
    exact = milp_energy(prof, 8, "1f1b", watts, res.budget_s)
    assert relative_gap(res.timeline.energy, exact, res.baseline.energy) <= 0.005


@pytest.mark.parametrize("seed", [3, 14, 27])
def test_never_worse_than_any_envpipe_policy_at_its_own_time(seed):
    case = random_case(seed)
    prof, M, W = case.profile, case.microbatches, case.watts
    for policy in POLICIES:
        for reconfig in RECONFIGS:
            env = make_plan(prof, M, idle_power_w=W, schedule=case.schedule, policy=policy, reconfig=reconfig)
            ours = optimal_plan(prof, M, idle_power_w=W, schedule=case.schedule,
                                time_budget_s=env.timeline.iteration_time)
            assert ours.timeline.iteration_time <= env.timeline.iteration_time * (1 + 1e-9)
            assert ours.timeline.energy <= env.timeline.energy * (1 + 1e-9), f"{case}: {policy}+{reconfig}"


@pytest.mark.parametrize("tail", [0.0, [0.05, 0.3, 0.0, 0.2], [0.4, 0.0, 0.0, 0.0]])
def test_tail_matches_milp_and_resimulates(tail):
    """A per-stage tail after the last unit (gradient all-reduce, optimizer step) ends the iteration."""
    prof = real_profile("gpt3-175b+a100_sxm_bf16")
    prof = cut_down(prof, [0, 1, 2, 3], spread_clocks(prof, 8))
    W = REAL["gpt3-175b+a100_sxm_bf16"][1]
    tail_s = np.asarray(tail, float)
    res = optimal_plan(prof, 8, idle_power_w=W, schedule="1f1b", max_slowdown=0.03, tail_s=tail_s)
    assert res.baseline.iteration_time == pytest.approx(
        evaluate_plan(make_plan(prof, 8, idle_power_w=W, policy="baseline", schedule="1f1b").plan, prof, W,
                      tail_s=tail_s).iteration_time)
    again = evaluate_plan(res.plan, prof, W, tail_s=tail_s)
    assert again.energy == pytest.approx(res.timeline.energy, rel=1e-12)
    assert again.iteration_time <= res.budget_s * (1 + 1e-9)
    exact = milp_energy(prof, 8, "1f1b", W, res.budget_s, tail_s=tail_s)
    assert relative_gap(again.energy, exact, res.baseline.energy) <= 0.005


def test_relative_gap_counts_a_worse_plan_as_positive():
    assert relative_gap(ours=95.0, exact=90.0, baseline=100.0) == pytest.approx(0.5)
    assert relative_gap(ours=90.0, exact=90.0, baseline=100.0) == 0.0

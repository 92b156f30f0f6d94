"""The optimal planner against exact references on random cut-downs of four real measured profiles:
the MILP optimum (within 0.5% of its saving), the LP bound, and every EnvPipe policy at its own time."""

from __future__ import annotations

import numpy as np
import pytest

from envpipe.plan.case import PipelineCase
from envpipe.plan.evaluate import baseline_timeline, evaluate_plan
from envpipe.plan.instances import (
    BLOCKING_POWER_W,
    cut_down,
    exact_energies,
    exact_energy,
    random_case,
    real_profile,
    spread_clocks,
)
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.plan.planner import make_plan
from envpipe.plan.policies import POLICIES
from envpipe.plan.reconfig import RECONFIGS, Reconfig
from envpipe.plan.simulate import Overheads

# seeds of random_case(): both schedules, all four profiles, 2-4 stages, M 4-8, 0-8% slowdown; each MILP
# solves in well under a second (benchmarks/planner_study/optimal.py runs many more)
SEEDS = [0, 3, 5, 9, 12, 13, 20, 21, 24, 30, 33, 36, 39]


def relative_gap(ours: float, exact: float, baseline: float) -> float:
    """How much of the exact optimum's saving the planner misses (0: none)."""
    return ((baseline - exact) - (baseline - ours)) / max(baseline - exact, 1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_within_half_a_percent_of_the_milp_saving(seed):
    case = random_case(seed)
    res = optimal_plan(case.case, case.schedule, max_slowdown=case.slowdown)
    assert res.budget_s is not None
    energies = exact_energies(case.case, case.schedule, res.budget_s)
    exact = min(energies.values())
    again = evaluate_plan(res.plan, case.case)  # the claim, re-simulated
    assert again.energy == pytest.approx(res.timeline.energy, rel=1e-12)
    assert again.iteration_time <= res.budget_s * (1 + 1e-9)
    assert relative_gap(again.energy, exact, res.baseline.energy) <= 0.005, str(case)
    # the LP value of the chosen order bounds that order's MILP optimum from below
    assert res.bound_j is not None
    assert res.bound_j <= energies[tuple(res.reschedule)] * (1 + 1e-7)


@pytest.mark.parametrize(("name", "slowdown"), [(name, 0.0) for name in sorted(BLOCKING_POWER_W)] + [
    ("gpt3-175b+a100_sxm_bf16", 0.03), ("bloom+a40_bf16", 0.03), ("bloom+a100_sxm_bf16", 0.03)])
def test_4x8x8_cut_downs_match_milp(name, slowdown):
    """The issue's example size: 4 stages x 8 micro-batches x 8 clocks, plain 1F1B."""
    prof = real_profile(name)
    prof = cut_down(prof, [0, 1, 2, 3], spread_clocks(prof, 8))
    case = PipelineCase.of(prof, 8, BLOCKING_POWER_W[name])
    res = optimal_plan(case, "1f1b", max_slowdown=slowdown)
    assert res.budget_s is not None
    exact = exact_energy(case, "1f1b", res.budget_s)
    assert relative_gap(res.timeline.energy, exact, res.baseline.energy) <= 0.005


@pytest.mark.parametrize("seed", [pytest.param(3, marks=pytest.mark.slow), 14,
                                  pytest.param(27, marks=pytest.mark.slow)])
def test_never_worse_than_any_envpipe_policy_at_its_own_time(seed):
    case = random_case(seed)
    for policy in POLICIES:
        for reconfig in RECONFIGS:
            env = make_plan(case.case, case.schedule, policy, Reconfig(reconfig))
            ours = optimal_plan(case.case, case.schedule, time_budget_s=env.timeline.iteration_time)
            assert ours.timeline.iteration_time <= env.timeline.iteration_time * (1 + 1e-9)
            assert ours.timeline.energy <= env.timeline.energy * (1 + 1e-9), f"{case}: {policy}+{reconfig}"


@pytest.mark.parametrize("tail", [pytest.param(0.0, marks=pytest.mark.slow), [0.05, 0.3, 0.0, 0.2],
                                  pytest.param([0.4, 0.0, 0.0, 0.0], marks=pytest.mark.slow)])
def test_tail_matches_milp_and_resimulates(tail):
    """A per-stage tail after the last unit (gradient all-reduce, optimizer step) ends the iteration."""
    prof = real_profile("gpt3-175b+a100_sxm_bf16")
    prof = cut_down(prof, [0, 1, 2, 3], spread_clocks(prof, 8))
    case = PipelineCase.of(prof, 8, BLOCKING_POWER_W["gpt3-175b+a100_sxm_bf16"], tail_s=np.asarray(tail, float))
    res = optimal_plan(case, "1f1b", max_slowdown=0.03)
    assert res.budget_s is not None
    assert res.baseline.iteration_time == pytest.approx(
        evaluate_plan(make_plan(case, "1f1b", "baseline").plan, case).iteration_time)
    again = evaluate_plan(res.plan, case)
    assert again.energy == pytest.approx(res.timeline.energy, rel=1e-12)
    assert again.iteration_time <= res.budget_s * (1 + 1e-9)
    exact = exact_energy(case, "1f1b", res.budget_s)
    assert relative_gap(again.energy, exact, res.baseline.energy) <= 0.005


@pytest.mark.parametrize(("blocking", "tail_power"), [
    pytest.param([60.0, 90.0, 120.0, 75.0], None, marks=pytest.mark.slow),
    ([83.64] * 4, [400.0, 250.0, 300.0, 200.0]),
    pytest.param([50.0, 110.0, 80.0, 140.0], [300.0, 90.0, 500.0, 140.0], marks=pytest.mark.slow)])
def test_per_stage_blocking_and_tail_powers_match_milp(blocking, tail_power):
    """Each stage waits at its own blocking power and runs its tail at its own power: the planner, its LP
    bound and the exact MILP all see the same energy as the simulator."""
    prof = real_profile("bloom+a100_sxm_bf16")
    prof = cut_down(prof, [0, 1, 2, 3], spread_clocks(prof, 8))
    case = PipelineCase(prof, 8, Overheads.broadcast(4, blocking, 0.001, [0.05, 0.3, 0.0, 0.2], tail_power))
    res = optimal_plan(case, "1f1b", max_slowdown=0.02)
    assert res.budget_s is not None and res.bound_j is not None
    again = evaluate_plan(res.plan, case)
    assert again.energy == pytest.approx(res.timeline.energy, rel=1e-12)
    assert again.energy == pytest.approx(again.stage_energy.sum(), rel=1e-12)
    assert res.baseline.energy == baseline_timeline(case).energy
    exact = exact_energy(case, "1f1b", res.budget_s)
    assert res.bound_j <= exact * (1 + 1e-7)
    assert relative_gap(again.energy, exact, res.baseline.energy) <= 0.005


def test_relative_gap_counts_a_worse_plan_as_positive():
    assert relative_gap(ours=95.0, exact=90.0, baseline=100.0) == pytest.approx(0.5)
    assert relative_gap(ours=90.0, exact=90.0, baseline=100.0) == 0.0

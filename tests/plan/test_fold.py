"""The periodic fold of the LP (envpipe/plan/optimal/fold.py): its structure, and that on real profiles it is a
restriction whose durations meet the budget and whose value equals the full LP's."""

from __future__ import annotations

import numpy as np
import pytest

from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import baseline_timeline
from envpipe.plan.instances import BLOCKING_POWER_W, real_profile, spread_clocks
from envpipe.plan.optimal.fold import identity_fold, periodic_fold
from envpipe.plan.optimal.lp import solve_relaxation
from envpipe.plan.optimal.problem import build_problem, candidate_orders
from envpipe.plan.schedules import one_f_one_b
from envpipe.plan.simulate import simulate


def test_fold_maps_steady_micro_batches_onto_one_period():
    dag = PipelineDag.from_orders(one_f_one_b(2, 16), 16)
    fold = periodic_fold(dag, period=2, margin=3, drift=True)
    # stage 0 runs F0 F1, then pairs B(m) F(m+2): its forwards are steady from micro-batch 2, its backwards
    # until 13; less the margin, F5..12 and B3..10 fold onto F5, F6 and B3, B4
    f0, b0 = dag.index(0, "F", 0), dag.index(0, "B", 0)
    assert fold.shift[f0:f0 + 16].tolist() == [0] * 7 + [1, 1, 2, 2, 3, 3] + [0] * 3
    assert fold.shift[b0:b0 + 16].tolist() == [0] * 5 + [1, 1, 2, 2, 3, 3] + [0] * 5
    assert fold.rep[f0 + 11] == fold.rep[f0 + 5] and fold.rep[b0 + 10] == fold.rep[b0 + 4]
    assert fold.weight[fold.rep[f0 + 5]] == 4
    assert fold.num_periods == 2 and periodic_fold(dag, 2, 3, drift=False).num_periods == 1
    assert periodic_fold(dag, period=8, margin=3, drift=False).is_identity  # fewer than 2 periods in a window
    assert identity_fold(5).is_identity


@pytest.mark.parametrize(("name", "schedule"), [("bloom+a100_sxm_bf16", "1f1b"), ("gpt3-175b+a40_bf16", "envpipe")])
def test_folded_lp_meets_the_budget_and_matches_the_full_lp(name, schedule):
    prof, watts = real_profile(name), BLOCKING_POWER_W[name]
    prof = prof.restricted(prof.freqs[spread_clocks(prof, 12)])
    M = 96
    case = PipelineCase.of(prof, M, watts)
    budget = baseline_timeline(case).iteration_time
    problem = build_problem(case, schedule, candidate_orders(case, schedule)[0])
    assert not problem.fold.is_identity
    full = solve_relaxation(problem.menus, problem.edges, budget, identity_fold(problem.dag.num_units))
    folded = solve_relaxation(problem.menus, problem.edges, budget, problem.fold)
    assert folded.folded and not full.folded
    assert full.energy * (1 - 1e-9) <= folded.energy <= full.energy * (1 + 1e-6)
    tl = simulate(problem.dag, folded.duration, np.zeros(problem.dag.num_units), case.overheads)
    assert tl.iteration_time <= budget * (1 + 1e-9)

from __future__ import annotations

import numpy as np
import pytest

from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import unit_clocks
from envpipe.plan.planner import make_plan
from envpipe.plan.policies import initial_clocks, is_envelope, valley_clocks
from envpipe.plan.reconfig import Reconfig, envpipe_critical_path
from envpipe.plan.schedules import one_f_one_b
from envpipe.profile.gpus import candidate_clocks
from tests.support.perseus import IDLE_W


def test_candidate_clock_filters():
    a100 = list(range(1410, 854, -15))
    assert candidate_clocks(a100, "a100") == [1410, 1350, 1260, 1170, 1080, 990, 900]
    v100 = [*range(1597, 134, -7), 1530, 1440, 810]
    assert candidate_clocks(v100, "v100")[:3] == [1597, 1530, 1440] and candidate_clocks(v100, "v100")[-1] == 810
    h200 = list(range(1980, 344, -15))
    assert candidate_clocks(h200, "h200") == list(range(1980, 989, -90))
    assert candidate_clocks([1000, 1200], "all") == [1200, 1000]
    with pytest.raises(ValueError, match="unknown GPU"):
        candidate_clocks(a100, "tpu")


def test_envelope_units_and_initial_clocks():
    dag = PipelineDag.from_orders(one_f_one_b(3, 4), 4)
    env = is_envelope(dag)
    chosen = {dag.unit(i) for i in np.flatnonzero(env)}
    expected = {(s, "F", 0) for s in range(3)} | {(s, "B", 3) for s in range(3)}
    expected |= {(2, k, m) for k in "FB" for m in range(4)}
    assert chosen == expected
    clocks = initial_clocks("envelope", dag, 1410, [900, 1000, 1410])
    assert clocks[dag.index(0, "F", 1)] == 900 and clocks[dag.index(1, "B", 2)] == 1000
    assert clocks[dag.index(0, "F", 0)] == 1410 and clocks[dag.index(1, "B", 3)] == 1410
    assert set(initial_clocks("baseline", dag, 1410, [900] * 3)) == {1410}
    with pytest.raises(ValueError, match="unknown policy"):
        initial_clocks("turbo", dag, 1410, [900] * 3)


def test_valley_clock_is_the_least_iteration_energy(gpt3):
    cands = candidate_clocks([int(f) for f in gpt3.freqs], "a100")
    valley = valley_clocks(PipelineCase.of(gpt3, 12, 83.64), cands, sweep_last_stage=False)
    assert valley[-1] == 1410 and all(v in cands for v in valley)
    # with no blocking power, the valley is the clock with the least unit energy per stage (no idle to pay)
    free = valley_clocks(PipelineCase.of(gpt3, 12, 0.0), cands, sweep_last_stage=True)
    for s in range(gpt3.num_stages):
        per_clock = [gpt3.fwd_energy[s, gpt3.freq_index(f)] + gpt3.bwd_energy[s, gpt3.freq_index(f)] for f in cands]
        assert free[s] == cands[int(np.argmin(per_clock))]


@pytest.mark.parametrize("name", ["gpt3", "bloom"])
@pytest.mark.parametrize("method", ["greedy", "balanced"])
def test_reconfiguration_only_raises_and_ends_on_the_envelope_or_at_max(name, method, request):
    profile = request.getfixturevalue(name).with_stages(4)
    idle = IDLE_W["gpt3-175b+a100_sxm_bf16" if name == "gpt3" else "bloom+a40_bf16"]
    case = PipelineCase.of(profile, 8, idle)
    start = make_plan(case, "envpipe", "envelope", Reconfig("default"))
    done = make_plan(case, "envpipe", "envelope", Reconfig(method))
    dag = done.timeline.dag
    clocks = unit_clocks(done.plan, dag)
    assert np.all(clocks >= unit_clocks(start.plan, dag))
    assert done.timeline.iteration_time <= start.timeline.iteration_time + 1e-9
    path = np.asarray(envpipe_critical_path(done.timeline, 4.0))
    on_envelope = is_envelope(dag)[path].all()
    all_max = (clocks[path] == profile.f_max).all()
    assert on_envelope or all_max, done.notes


def test_envelope_plan_saves_energy_on_gpt3(gpt3):
    r = make_plan(PipelineCase.of(gpt3, 12, 83.64), "envpipe", "envelope", Reconfig("greedy"))
    saving = 1 - r.plan.predicted["energy_j"] / r.plan.predicted["baseline_energy_j"]
    slowdown = r.plan.predicted["iteration_time_s"] / r.plan.predicted["baseline_time_s"] - 1
    assert saving > 0.10 and slowdown < 0.01
    P = gpt3.num_stages
    assert r.reschedule[-1] == 0
    assert all(0 <= r_s <= 12 - (P - s) or r_s == 0 for s, r_s in enumerate(r.reschedule))


def test_baseline_plan_is_the_baseline(bloom):
    r = make_plan(PipelineCase.of(bloom, 24, 70.38), "1f1b", "baseline", Reconfig("balanced"))
    assert r.plan.predicted["energy_j"] == pytest.approx(r.plan.predicted["baseline_energy_j"])
    assert r.plan.policy == "baseline" and not any("reconfiguration" in n for n in r.notes)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (lambda case: make_plan(case, schedule="zigzag"), "unknown schedule"),
        (lambda case: make_plan(case, policy="turbo"), "unknown policy"),
        (lambda case: make_plan(case, reconfig=Reconfig("sometimes")), "unknown reconfiguration"),
        (lambda case: make_plan(PipelineCase.of(case.profile, 8, -1.0)), "blocking powers must be finite and not"),
        (lambda case: make_plan(case, gpu="tpu"), "unknown GPU"),
        (lambda case: make_plan(case, reconfig=Reconfig(threshold_scale=0.0)), "threshold scale"),
        (lambda case: make_plan(case, "interleaved"), "does not run on this layout"),
        (lambda case: PipelineCase.of(case.profile, 0, 83.64), "at least 1"),
    ],
)
def test_bad_planner_arguments(gpt3, plan, message):
    with pytest.raises(ValueError, match=message):
        plan(PipelineCase.of(gpt3, 8, 83.64))


def test_make_plan_counts_the_tail_in_every_iteration(gpt3) -> None:
    """A per-stage tail (gradient all-reduce + optimizer step) is in the plan's and the baseline's time."""
    M, w = 8, IDLE_W["gpt3-175b+a100_sxm_bf16"]
    plain = make_plan(PipelineCase.of(gpt3, M, w), gpu="a100")
    tailed = make_plan(PipelineCase.of(gpt3, M, w, tail_s=0.25), gpu="a100")
    assert tailed.baseline.iteration_time == pytest.approx(plain.baseline.iteration_time + 0.25)
    assert tailed.plan.predicted["iteration_time_s"] >= plain.plan.predicted["iteration_time_s"] + 0.25 - 1e-9
    assert tailed.timeline.tail_s.tolist() == [0.25] * gpt3.num_stages
    with pytest.raises(ValueError, match="tail times given"):
        PipelineCase.of(gpt3, M, w, tail_s=[0.1, 0.2])


def test_a_slower_envpipe_plan_says_so(bloom):
    """On BLOOM the envelope's last-stage assumption fails and the plan runs slower than the baseline
    (docs/planner.md): its overrun is what the CLI warns about."""
    r = make_plan(PipelineCase.of(bloom, 24, 70.38))
    assert r.budget_s is None
    assert r.overrun == pytest.approx(r.timeline.iteration_time / r.baseline.iteration_time - 1)
    assert r.overrun > 0.1

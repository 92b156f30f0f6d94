"""First, do no harm (fast): the verdict on the comparison pairs with worked numbers and properties, and the steady
phase that acts on it (what runs after the pairs), driven iteration by iteration without processes.
tests/runtime/test_dropin.py runs the rule inside real DeepSpeed jobs on the simulated GPU."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from envpipe.runtime import summary as S
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.measure.iterations import BASELINE, PLAN, paired
from envpipe.runtime.measure.timing import StageTiming
from envpipe.runtime.phases import noharm
from envpipe.runtime.phases.steady import STEADY, WARMUP, SteadyRecord, steady
from envpipe.runtime.rig import Measured

ORDER = "the plan's order, envpipe (extra warm-up forwards per stage: [1, 0]), at default clocks"


def _pairs(slowdowns: list[float], savings: list[float] | None = None) -> list:
    base_t, base_e = 1.0, 100.0
    savings = savings if savings is not None else [0.0] * len(slowdowns)
    return [((base_t * (1 + s), base_e * (1 - e)), (base_t, base_e)) for s, e in zip(slowdowns, savings, strict=True)]


def test_an_order_without_clocks_that_measures_slower_gives_way_to_1f1b() -> None:
    """EnvPipe's order on 4 x H200 without the daemon (2026-11-28): +2.7 % time, 1.3 % more energy."""
    v = noharm.judge(_pairs([0.027, 0.026, 0.028], [-0.013, -0.012, -0.014]), 0.0, clocks_run=False, what=ORDER)
    assert not v.kept and v.slowdown == pytest.approx(0.027) and v.energy_saving == pytest.approx(-0.013)
    assert v.reason == (f"{ORDER}: +2.7 % time and 1.3 % more energy against this run's 1F1B all-max iterations "
                        "(measured, 3 pairs): over the 0 % budget and dearer in energy; running 1F1B with every "
                        "clock at max")


def test_an_order_without_clocks_must_measure_at_least_as_fast_and_no_dearer() -> None:
    """No allowance for an order alone: a tie in time stays; 0.1 % slower, or faster but dearer, goes to 1F1B."""
    assert noharm.judge(_pairs([0.0, 0.0]), 0.0, False, ORDER).kept
    assert noharm.judge(_pairs([-0.003, -0.001], [0.001, 0.001]), 0.0, False, ORDER).kept
    slower = noharm.judge(_pairs([0.001, 0.001]), 0.0, False, ORDER)
    assert not slower.kept and "over the 0 % budget" in slower.reason
    dearer = noharm.judge(_pairs([-0.01, -0.01], [-0.002, -0.001]), 0.0, False, ORDER)
    assert not dearer.kept and dearer.reason.endswith("dearer in energy; running 1F1B with every clock at max")


def test_a_plan_with_clocks_is_allowed_its_pairs_noise_and_no_more() -> None:
    """Clocks run: the plan is there for its energy; a slowdown within the pairs' noise (at least 0.5 %) stays."""
    kept = noharm.judge(_pairs([0.004, 0.002, 0.003, 0.001], [0.1] * 4), 0.0, True, "the plan")
    assert kept.kept and kept.allowed_slowdown == pytest.approx(noharm.TOLERANCE)
    noisy = _pairs([0.0, 0.02, 0.04, 0.06], [0.1] * 4)  # median 3 %, half the IQR 1.5 %
    assert not noharm.judge(noisy, 0.0, True, "the plan").kept
    assert noharm.judge(noisy, 0.02, True, "the plan").kept  # a 2 % budget: 3 % is within it and its noise
    assert not noharm.judge(_pairs([0.0] * 3, [-0.02] * 3), 0.0, True, "the plan").kept  # dearer than 1F1B


def test_without_a_counter_time_alone_decides() -> None:
    pairs = [((1.0, None), (1.0, None)), ((0.99, None), (1.0, None))]
    v = noharm.judge(pairs, 0.0, False, ORDER)
    assert v.kept and v.energy_saving is None and "energy" not in v.reason.split("time")[1]
    with pytest.raises(ValueError, match="no comparison pair"):
        noharm.judge([], 0.0, False, ORDER)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-0.2, 0.2), min_size=1, max_size=12), st.floats(0.0, 0.5), st.booleans(),
       st.floats(0.0, 0.3))
def test_what_is_kept_never_measured_slower_than_its_allowance(slowdowns: list[float], allowed: float,
                                                             clocks: bool, worse: float) -> None:
    """Whatever the pairs: a kept verdict's median slowdown is within the allowed slowdown it states, and making
    every pair slower never turns a refused verdict into a kept one."""
    v = noharm.judge(_pairs(slowdowns), allowed, clocks, "the plan")
    assert v.kept == (v.slowdown <= v.allowed_slowdown)
    assert v.allowed_slowdown >= allowed and (clocks or v.allowed_slowdown == allowed)
    if not v.kept:
        assert not noharm.judge(_pairs([s + worse for s in slowdowns]), allowed, clocks, "the plan").kept


class _Rig:
    """What the steady phase asks of the rig."""

    def __init__(self, baseline: Plan) -> None:
        self.baseline, self.cfg, self.sim = baseline, EnvPipeConfig(), None

    def has_run(self, plan: Plan) -> bool:
        return True


@pytest.mark.parametrize(("plan_time", "kept"), [(1.03, False), (0.99, True)])
def test_the_steady_phase_runs_1f1b_after_pairs_whose_order_measured_slower(
        monkeypatch: pytest.MonkeyPatch, plan_time: float, kept: bool) -> None:
    """A GPU without the clock daemon: the plan's order against 1F1B; slower, the rest of the job runs 1F1B (and
    the record says so), faster, the order stays."""
    monkeypatch.setattr("envpipe.runtime.phases.steady.progress", lambda _: None)
    baseline = Plan.at_one_clock(one_f_one_b(2, 4), 1410, "1f1b", "baseline")
    order = Plan.at_one_clock(envpipe_schedule(2, 4, [1, 0]), 1410, "envpipe", "optimal")
    record = SteadyRecord(order, PLAN, pairs=2)
    ran: list[tuple[str, float]] = []

    def judge() -> S.Verdict:  # the run gathers the job's pairs; here one rank's
        return noharm.judge(paired([(r, t, None) for r, t in ran]), 0.0, False, ORDER)

    phase = steady(_Rig(baseline), record, 0, lambda: None, judge)  # type: ignore[arg-type]
    step = next(phase)
    steps = []
    for _ in range(8):
        steps.append(step)
        t = plan_time if step.runs == PLAN else 1.0
        ran.append((step.runs, t))
        step = phase.send(Measured(StageTiming(0, 0.0, t, []), None, None, None))
    assert all(x.phase == STEADY for x in steps) and WARMUP not in {x.phase for x in steps}
    assert [x.runs for x in steps[:4]] == [PLAN, BASELINE, BASELINE, PLAN]
    after = steps[4:]
    assert record.verdict is not None and record.verdict.kept is kept
    assert {x.runs for x in after} == {PLAN if kept else BASELINE}
    assert all(x.plan.orders() == (order if kept else baseline).orders() for x in after)
    now = order if kept else baseline
    assert record.main == (PLAN if kept else BASELINE) and record.runs.orders() == now.orders()

"""The rehearsal's parts (fast): each unit's planned stretch from the profile, where the schedules put the delay,
the simulated GPU's stretched unit, and the report's numbers from every rank's iterations. A real DeepSpeed job
rehearses on the simulated GPU in tests/runtime/test_optimal.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from deepspeed.runtime.pipe import schedule as ds

from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.decision import Decision, Origin
from envpipe.runtime.engine.schedule import (
    Stock1F1BSchedule,
    Stretch,
    UnitEnd,
    UnitExtras,
    UnitOrderSchedule,
    UnitStart,
)
from envpipe.runtime.measure.collective import Place
from envpipe.runtime.measure.iterations import BASELINE, PLAN
from envpipe.runtime.measure.timing import StageTiming
from envpipe.runtime.phases import reconfigure
from envpipe.runtime.phases.rehearse import REHEARSAL, lowers_clocks, stretches, summarize, unit_time
from envpipe.runtime.phases.steady import WARMUP
from envpipe.runtime.rig import Measured
from envpipe.simgpu import JobTruth, SimGpu
from envpipe.simgpu.gpu import COLD_ENV, Cold

FREQS = np.array([1400, 1200, 1000])


def _profile() -> Profile:
    """Two stages: forwards 10 / 20 ms at the top clock, slower by 20 % and 50 % at 1200 and 1000 MHz."""
    slow = np.array([1.0, 1.2, 1.5])
    f = np.array([0.010 * slow, 0.020 * slow])
    return Profile(FREQS, f, 2 * f, 100 * f, 200 * f, "test")


def test_a_units_stretch_is_its_extra_time_at_its_planned_clock() -> None:
    profile = _profile()
    assert unit_time(profile, 1, "F", 1200) == pytest.approx(0.024)
    assert unit_time(profile, 0, "B", 1100) == pytest.approx(0.027)  # between clocks: linear
    assert unit_time(profile, 0, "F", 1980) == pytest.approx(0.010)  # above the profile's clocks: flat
    orders = one_f_one_b(2, 2)
    plan = Plan.at_one_clock(orders, 1400, "1f1b", "optimal").with_clocks([[1400, 1200, 1000, 1400], [1000] * 4])
    assert [u.kind for u in plan.stages[0]] == ["F", "F", "B", "B"]
    assert stretches(plan, profile, 0, 1400) == pytest.approx([0.0, 0.002, 0.010, 0.0])
    assert stretches(plan, profile, 1, 1400) == pytest.approx([0.010, 0.020, 0.010, 0.020])


@pytest.mark.parametrize("timed", [True, False])
def test_the_delay_follows_the_units_pass_inside_its_marks(timed: bool) -> None:
    """After the pass and before its end mark (a slower unit ends later), in both schedules, whether timed or not;
    a unit without a stretch gets no instruction."""
    stretch = [0.0, 0.002, 0.010, 0.0]
    stock = [c for step in Stock1F1BSchedule(2, 2, 0, UnitExtras(stretch=stretch, timed=timed)).steps() for c in step]
    posted = [c for step in UnitOrderSchedule(envpipe_schedule(2, 2, [0, 0])[0], 2, 2, 0,
                                              UnitExtras(stretch=stretch, timed=timed)).steps() for c in step]
    for cmds in (stock, posted):
        passes = [i for i, c in enumerate(cmds) if isinstance(c, ds.ForwardPass | ds.BackwardPass)]
        delays = [(i, c.kwargs["seconds"]) for i, c in enumerate(cmds) if isinstance(c, Stretch)]
        assert [s for _, s in delays] == [0.002, 0.010]
        assert [i - 1 for i, _ in delays] == [passes[1], passes[2]]
        if timed:
            assert all(isinstance(cmds[i + 1], UnitEnd) for i, _ in delays)
            assert sum(isinstance(c, UnitStart) for c in cmds) == 4
    with pytest.raises(ValueError, match="3 stretches for 4 units"):
        Stock1F1BSchedule(2, 2, 0, UnitExtras(stretch=[0.0] * 3))


def test_a_simulated_gpu_ends_a_stretched_unit_exactly_that_much_later_at_its_blocking_power() -> None:
    truth = JobTruth.embedded(2)
    plain, stretched = (SimGpu(truth, 0, noise=0.0) for _ in range(2))
    for gpu, extra in ((plain, 0.0), (stretched, 0.004)):
        gpu.unit_start()
        if extra:
            gpu.stretch(extra)
        gpu.unit_end("F", 1e12)
    assert stretched.now() - plain.now() == pytest.approx(0.004, abs=1e-12)
    assert stretched.energy_j() - plain.energy_j() == pytest.approx(0.004 * truth.stage(0).blocking_w)
    with pytest.raises(RuntimeError, match="a stretch belongs to a running unit"):
        plain.stretch(0.001)


def test_the_report_pairs_the_jobs_iterations_and_each_stages_delays() -> None:
    """Two stages: the job's time per iteration is its slowest rank's; per stage the planned and inserted delay."""
    predicted = S.PredictedComparison(1.0, 90.0, 1.0, 100.0, 0.1, 0.002, "test")

    def its(plan_s: float, inserted: float | None) -> list[tuple[str, float, float | None]]:
        rehearsed = (REHEARSAL, plan_s, inserted)
        return [rehearsed, (BASELINE, 1.0, None), (BASELINE, 1.0, None), rehearsed]

    gathered = [(Place(0, 0, 0, "h", 0), (0.030, its(1.01, 0.0301))),
                (Place(1, 1, 0, "h", 0), (0.0, its(1.02, None)))]
    r = summarize(gathered, predicted, "measured (wall clock)")
    assert r.pairs == 2 and r.slowdown.median == pytest.approx(0.02)  # stage 1 ended last
    assert r.predicted_slowdown == 0.002 and r.error == pytest.approx(0.002 - 0.02)
    assert [(x.stage, x.planned_s, x.inserted_s) for x in r.stages] == [(0, 0.030, 0.0301), (1, 0.0, None)]


def test_only_a_plan_below_the_top_clock_has_anything_to_rehearse() -> None:
    orders = one_f_one_b(2, 2)
    top = Plan.at_one_clock(orders, 1400, "1f1b", "optimal")
    decision = Decision(Origin.PLANNER, "test", "optimal", "1f1b", {0: top, 1: top}, clocks_settable=False)
    assert not lowers_clocks(decision, 1400)
    one_low = top.with_clocks([[1400] * 4, [1400, 1400, 1200, 1400]])
    assert lowers_clocks(replace(decision, plans={0: top, 1: one_low}), 1400)  # any replica's plan counts
    assert not lowers_clocks(replace(decision, plans={0: one_low}), 1200)


def test_a_cold_simulated_gpu_runs_its_first_units_slower_by_exactly_its_factor() -> None:
    """The drift the H200 runs showed (unit times after calibration differ from calibration's), on the simulated
    GPU: the first `units` units take `factor` x their time, the later ones their own."""
    truth = JobTruth.embedded(2)
    warm, cold = SimGpu(truth, 1, noise=0.0), SimGpu(truth, 1, noise=0.0, cold=Cold(2, 1.5))
    times: dict[str, list[float]] = {"warm": [], "cold": []}
    for name, gpu in (("warm", warm), ("cold", cold)):
        for _ in range(4):
            start = gpu.unit_start()
            times[name].append(gpu.unit_end("F", 1e12) - start)
    assert [c / w for c, w in zip(times["cold"], times["warm"], strict=True)] == pytest.approx([1.5, 1.5, 1.0, 1.0])


@pytest.mark.parametrize(("value", "stage", "expected"), [("", 1, None), ("1:32:1.3", 1, Cold(32, 1.3)),
                                                         ("1:32:1.3", 0, None), ("0:0:2", 0, Cold(0, 2.0))])
def test_the_cold_stage_comes_from_the_environment(value: str, stage: int, expected: Cold | None) -> None:
    assert Cold.of_stage(stage, {COLD_ENV: value}) == expected


@pytest.mark.parametrize("value", ["1:32", "a:1:1", "1:-1:1.3", "1:4:0", "1:4:nan", "1:4:inf", "1:2:3:4"])
def test_a_bad_cold_stage_is_one_line(value: str) -> None:
    with pytest.raises(ValueError, match=f"{COLD_ENV}=") as e:
        Cold.of_stage(1, {COLD_ENV: value})
    assert "\n" not in str(e.value)


class _Rig:
    """What a reconfiguration round asks of the rig (one rank, no collectives)."""

    def __init__(self, baseline: Plan, ran: bool) -> None:
        self.baseline, self._ran = baseline, ran

    def has_run(self, plan: Plan) -> bool:
        return self._ran

    def gather_each(self, mine: list) -> list:
        return [[(Place(0, 0, 0, "h", 0), x)] for x in mine]


@pytest.mark.parametrize("ran", [False, True])
def test_a_rehearsed_round_warms_a_new_order_pairs_untimed_and_times_its_own_1f1b(ran: bool) -> None:
    """A rehearsed round: a new order's warm-up (not compared), the stretched plan against 1F1B untimed in ABBA
    pairs (as the job runs them), then ROUND_PAIRS timed 1F1B all-max iterations whose units correct the profile;
    a round with clocks keeps its timed pairs and nothing else."""
    baseline = Plan.at_one_clock(one_f_one_b(2, 2), 1400, "1f1b", "baseline")
    plan = Plan.at_one_clock(envpipe_schedule(2, 2, [1, 0]), 1400, "envpipe", "optimal")
    stretch = [0.0, 0.001, 0.002, 0.0]
    for rehearsed in (True, False):
        phase = reconfigure._round(_Rig(baseline, ran), plan, 3, stretch if rehearsed else None)  # type: ignore[arg-type]
        steps, step = [], next(phase)
        try:
            while True:
                steps.append(step)
                step = phase.send(Measured(StageTiming(0, 0.0, 1.0, []), None, None, None))
        except StopIteration as done:
            gathered = done.value
        seen = [(x.phase, x.runs, x.timed, x.stretch is not None) for x in steps]
        pairs = [("reconfigure", r, not rehearsed, rehearsed and r == PLAN) for r in (PLAN, BASELINE, BASELINE, PLAN)]
        if rehearsed:
            warm = [] if ran else [(WARMUP, PLAN, False, True)]
            timed_1f1b = [("reconfigure", BASELINE, True, False)] * 2
            assert seen == [*warm, *pairs, *timed_1f1b]
            assert all(x.extra == {"round": 3, "rehearsed": True} for x in steps)
            assert gathered.runs() == [PLAN, BASELINE, BASELINE, PLAN, reconfigure.TIMED, reconfigure.TIMED]
        else:
            assert seen == pairs and len(gathered.iterations) == 4

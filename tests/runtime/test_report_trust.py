"""Whether a run's predictions can be trusted, and how the report, the headline and the monitor say so (fast)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from envpipe.runtime import summary as S
from envpipe.runtime.report.monitor import Finished, MonitorFeed
from envpipe.runtime.report.prediction import trust
from envpipe.runtime.report.text import headline, render_report
from tests.support.runtime_summary import sample_calibrated, sample_summary


def _with(settled: bool | None = True, change: float | None = 0.002, time_error: float = 0.01,
          stage_errors: tuple[float, float] = (0.01, -0.02)) -> S.RunSummary:
    s = sample_summary(data_parallel=1)
    cal = replace(sample_calibrated().report, iterations=4, ran=6, settled=settled, change=change)
    stages = [S.StageEnergy(i, 100 * (1 + e), 100.0, e) for i, e in enumerate(stage_errors)]
    energy = S.EnergyPrediction(stages, sum(x.predicted_j for x in stages), 200.0,
                                sum(x.predicted_j for x in stages) / 200.0 - 1, "measured (NVML counter)")
    return replace(s, calibration=cal, time_error=time_error, energy=energy)


def test_a_settled_calibration_and_predictions_within_their_bands_are_trusted() -> None:
    t = trust(_with())
    assert t.trusted and t.reasons == []


@pytest.mark.parametrize(("summary", "reason"), [
    (_with(settled=False, change=-0.07), "the calibration's iteration time never settled (its median still moved "
                                          "-7.0 % after 6 iterations)"),
    (_with(settled=None, change=None), "4 measured calibration iteration(s): too few to tell whether the time settled"),
    (_with(time_error=0.243), "iteration time predicted +24.3 % off the measured (band +-3 %)"),
    (_with(stage_errors=(-0.177, 0.126)), "stage 0's energy predicted -17.7 % off the counter (band +-5 %)"),
])
def test_each_reason_a_prediction_cannot_be_trusted_is_one_line(summary: S.RunSummary, reason: str) -> None:
    """The CNN pipeline on 2 x H200 (2026-11-28): time +15.6 %, stage 0 -17.7 %: numbers a report must flag."""
    t = trust(summary)
    assert not t.trusted and reason in t.reasons, t.reasons
    flagged = replace(summary, trust=t)
    text = render_report(flagged, "out")
    assert f"predictions NOT trusted: {'; '.join(t.reasons)}" in text
    assert headline(flagged).endswith("(predictions flagged: see below)")


def test_the_report_leads_with_what_the_run_saved_against_what() -> None:
    s = replace(_with(), trust=trust(_with()))
    plan = S.PlanInfo("optimal", "1f1b", "planner", "d", None, [], None, None, [], True, True)
    measured = S.MeasuredComparison(4, S.Spread.of([0.104] * 4), S.Spread.of([-0.001] * 4), "simulated GPU")
    sim = replace(s, plan=plan, measured=measured,
                  clock=replace(s.clock, energy="simulated GPU", time="simulated GPU"))
    first = render_report(sim, "out").splitlines()[0]
    assert first == ("saved 10.4% energy at -0.1% time against this run's own 1F1B all-max iterations (simulated GPU, "
                     "4 pairs) (predictions held)")
    refused = S.Verdict(False, "the plan's order, 1f1b, at default clocks", 0.027, -0.013, 0.0, "it measured slower")
    assert headline(replace(sim, verdict=refused)).startswith("saved nothing: it measured slower (no harm;")
    text = render_report(replace(sim, verdict=refused), "out")
    assert "  no harm (what runs after the pairs): it measured slower" in text


def test_the_monitor_says_whether_the_plan_stays_and_the_predictions_hold() -> None:
    feed = MonitorFeed(lambda _: None, "measured", simulated_time=False)
    row = [Finished(7, 0, "steady", "baseline", 0.5, 100.0, 16, 112, 0.0)]
    tags = {tag for tag, _, _ in feed.events(row)}
    assert not {"EnvPipe/Samples/plan_kept", "EnvPipe/Samples/prediction_trusted"} & tags  # nothing decided yet
    feed.plan_kept, feed.trusted = False, True
    events = {tag: value for tag, value, _ in feed.events(row)}
    assert events["EnvPipe/Samples/plan_kept"] == 0 and events["EnvPipe/Samples/prediction_trusted"] == 1

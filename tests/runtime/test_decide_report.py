"""Rank 0's decision (plan files, EnvPipe's rule, the memory limit), and the typed summary and its files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from envpipe.plan.case import PipelineCase
from envpipe.plan.planfile import Plan, PlanError
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b, reschedule_counts
from envpipe.profile import embedded_profile_path, load_profile
from envpipe.runtime import summary as S
from envpipe.runtime.config import parse
from envpipe.runtime.decision import Job, Origin, plan_digest
from envpipe.runtime.measure.timing import SimInputs
from envpipe.runtime.phases import decide
from envpipe.runtime.report.files import write_report
from tests.support.runtime_summary import read_summary, sample_calibrated, sample_summary

CAL = SimInputs([0.01, 0.01], [0.02, 0.02], [0.0, 0.0], 0.0, [0.001, 0.001], 0.0)


def plan_json(orders, clocks=1410, **extra) -> dict:
    return {
        "version": 1,
        "num_stages": len(orders),
        "num_microbatches": len(orders[0]) // 2,
        "schedule": "envpipe",
        "policy": "envelope",
        "stages": [[{"kind": k, "mb": m, "freq_mhz": clocks} for k, m in o] for o in orders],
        "predicted": {"iteration_time_s": 1.5, "energy_j": 10.0, "baseline_time_s": 1.4, "baseline_energy_j": 12.0},
        "critical_path": [],
        **extra,
    }


def test_plan_file_decision_names_the_file_and_its_digest(tmp_path: Path) -> None:
    orders = envpipe_schedule(2, 4, [2, 0])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_json(orders, 1200)))
    d = decide.from_plan_file(str(path), Job(2, 4, 2, True, 1410), CAL)
    assert d.plan_for(1).orders() == orders and d.plan_for(0).clocks() == [[1200] * 8, [1200] * 8]
    assert d.info.source.startswith(f"plan file {path} (sha256 ") and d.info.policy == "envelope"
    p = d.predicted
    assert p is not None and p.profile.startswith("the plan file's own prediction (simulated")
    assert p.energy_j == 20.0 and p.energy_saving == pytest.approx(1 - 10 / 12)  # two replicas, one ratio


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{nope", "not JSON"),
        (json.dumps({"version": 2}), "unsupported plan version"),
        (json.dumps(plan_json(one_f_one_b(4, 4))), "plan is for 4 stages x 4 micro-batches, this run has 2 x 4"),
        (json.dumps(plan_json([one_f_one_b(2, 2)[0], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]])), "directly follow"),
    ],
)
def test_bad_plan_files_are_one_line(tmp_path: Path, content, message) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    M = 2 if "directly" in message else 4
    with pytest.raises(PlanError, match=message) as exc:
        decide.from_plan_file(str(path), Job(2, M, 1, True, 1410), CAL)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)


def test_envpipe_rule_and_the_memory_limit() -> None:
    # Tb = 2 Tf: stage s can fill 2 (P-s-1) forwards, capped at M-(P-s); last stage 0
    assert reschedule_counts([2, 2, 2, 2], [1, 1, 1, 1], 16) == [6, 4, 2, 0]
    assert reschedule_counts([2, 2, 2, 2], [1, 1, 1, 1], 4) == [0, 1, 2, 0]
    cal = SimInputs([1.0] * 4, [2.0] * 4, [0.0] * 4, 0.0, [0.0] * 4, 0.0)
    cfg = parse({"type": "baseline"}, {})
    job = Job(4, 16, 1, True, 1410)
    free = decide.envpipe_rule(cfg, job, cal, [])
    assert free.plan_for(0).orders() == envpipe_schedule(4, 16, [6, 4, 2, 0]) and not free.info.refused_orders
    # stage 0 may keep 5 micro-batches in flight (1F1B needs 4): one extra warm-up forward, not six
    tight = [S.MemoryUse(2**20, 0, 6 * 2**20, 5 * 2**20, 5, 4)] + [
        S.MemoryUse(2**20, 0, 2**30, 2**30, 1024, 4 - s) for s in (1, 2, 3)]
    capped = decide.envpipe_rule(cfg, job, cal, tight)
    assert capped.plan_for(0).orders() == envpipe_schedule(4, 16, [1, 1, 1, 0])
    assert len(capped.info.refused_orders) == 1 and "on stage 0: 10 micro-batches in flight" in \
        capped.info.refused_orders[0] and "capped at 1" in capped.info.refused_orders[0]
    assert decide.envpipe_rule(parse({"type": "baseline", "scheduling": "1f1b"}, {}), job, cal,
                               []).plan_for(0).orders() == one_f_one_b(4, 16)


def test_a_planner_decision_holds_its_state_and_the_report_derives_from_it() -> None:
    profile = load_profile(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))
    two = type(profile)(profile.freqs, profile.fwd_time[:2], profile.bwd_time[:2], profile.fwd_energy[:2],
                        profile.bwd_energy[:2], "two stages")
    calibrated = sample_calibrated()
    job = Job(2, 8, 2, True, int(profile.freqs.max()))
    chosen = decide.choose(parse({"max_slowdown": 0.02}, {}), job, calibrated, two)
    assert chosen.origin == Origin.PLANNER and chosen.policy == "optimal" and chosen.budget_s is not None
    assert chosen.memory == tuple(calibrated.memory) and chosen.profile is two
    info = chosen.info
    assert (info.budget_s, info.order, info.digest) == (chosen.budget_s, chosen.order,
                                                       plan_digest(chosen.plans[0]))
    assert info.clocks == chosen.plans[0].clocks() and info.orders[0][0] == "F0" and info.deployed
    # re-planning keeps where the plan came from and names what changed
    baseline = Plan.at_one_clock(one_f_one_b(2, 8), job.f_max, "1f1b", "baseline")
    again = decide.replanned(chosen, baseline, "1f1b", PipelineCase(two, 8, calibrated.overheads()), 1.0)
    assert (again.source, again.policy, again.memory, again.origin) == (chosen.source, chosen.policy,
                                                                         chosen.memory, chosen.origin)
    assert again.info.order == "1f1b" and again.info.budget_s == 1.0 and again.plans[1] is baseline
    assert again.predicted is not None and again.predicted.energy_saving == pytest.approx(0.0, abs=1e-12)


def test_the_planners_memory_model_from_measured_stages() -> None:
    mem = [S.MemoryUse(100, 0, 1000, 600, 6, 2), S.MemoryUse(100, 0, 1000, 900, 9, 1)]
    model, only_1f1b = decide.usable_memory(mem)
    assert model is not None and model.capacity() == [6, 9] and not only_1f1b
    assert decide.usable_memory([S.MemoryUse(100, 0, None, None, None, 2)] * 2) == (None, False)  # CPU: no limit
    starved = [S.MemoryUse(100, 0, 1000, 100, 1, 2), S.MemoryUse(100, 0, 1000, 900, 9, 1)]  # 1F1B keeps 2 > 1
    assert decide.usable_memory(starved) == (None, True)
    assert decide.over_memory(starved, 8) == [
        "stage 0: even 1F1B keeps 2 micro-batches in flight, above the 1 that fit under the memory limit; "
        "the order stays 1F1B there"]


def test_summary_round_trip_and_schema(tmp_path: Path) -> None:
    s = sample_summary()
    write_report(tmp_path, s)
    assert read_summary(tmp_path) == s  # validated against the committed schema, read back as the type
    headline, first = (tmp_path / "report.txt").read_text().splitlines()[:2]  # the result, then the run
    assert headline == "envpipe: 160.00 samples/s (measured (wall clock))"
    assert first.startswith("EnvPipe run: 2 stages x 8 micro-batches")
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "summary.json").read_text())
    schema = json.loads(S.SCHEMA_PATH.read_text())
    for broken in ({**data, "surprise": 1}, {**data, "steady": None}, {**data, "schema_version": 3}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
    with pytest.raises(ValueError, match=r"summary\.steady: Input should be an object"):
        S.RunSummary.from_json({**data, "steady": None})
    with pytest.raises(ValueError, match=r"summary\.steady\.time_s\.n: Input should be a valid integer"):
        steady = data["steady"]
        S.RunSummary.from_json({**data, "steady": {**steady, "time_s": {**steady["time_s"], "n": "1"}}})
    with pytest.raises(ValueError, match=r"not an EnvPipe run summary \(schema version 1 or 2\)"):
        S.RunSummary.from_json({**data, "schema_version": 3})


def test_version_1_summaries_read_with_the_error_convention_of_version_2() -> None:
    """A version 1 file kept measured / predicted - 1; it reads as (predicted - measured) / measured."""
    data = sample_summary(time_s=0.2, predicted_s=0.25).to_json()
    new = ("time_error", "energy", "oracle", "wall_throughput_samples_per_s")
    old = {k: v for k, v in data.items() if k not in new}
    old.update(schema_version=1, prediction_error=0.2 / 0.25 - 1)
    old["plan"] = None
    read = S.RunSummary.from_json(old)
    assert read.time_error == pytest.approx((0.25 - 0.2) / 0.2) and read.schema_version == 2


def test_committed_schema_is_the_generated_one() -> None:
    """`python -m envpipe.runtime.summary` regenerates it; a field added without it fails here."""
    assert json.loads(S.SCHEMA_PATH.read_text()) == S.schema()


def test_spread() -> None:
    s = S.Spread.of([3.0, 1.0, 2.0, 4.0])
    assert s is not None and (s.median, s.min, s.max, s.n) == (2.5, 1.0, 4.0, 4) and s.q1 < s.median < s.q3
    assert S.Spread.of([]) is None and S.Spread.of([2.0]) == S.Spread(2.0, 2.0, 2.0, 2.0, 2.0, 1)


def test_profile_clocks_spread_over_supported() -> None:
    from envpipe.runtime.phases.profiling import profile_clocks

    assert profile_clocks([1410, 1395, 1380, 1365, 1350], 3) == [1410, 1380, 1350]
    assert profile_clocks([1005, 1410], 4) == [1410, 1005]
    assert profile_clocks([1410, 1200], 1) == [1410]


@pytest.mark.parametrize(("time_kind", "label"), [("measured (wall clock)", "measured"),
                                                  ("simulated GPU", "simulated GPU")])
def test_the_runtime_gantt_says_what_ran_and_what_kind_its_times_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, time_kind: str, label: str
) -> None:
    """Read from the figure's artists: the title names what ran (the plan, or 1F1B all-max where the order
    did not run) and whether its times are measured or the simulated GPU's."""
    from envpipe.plan import gantt
    from envpipe.runtime.report.files import draw_gantt

    drawn = []
    real = gantt.gantt_figure

    def keep(*args: object, **kwargs: object) -> object:
        drawn.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return drawn[-1]

    monkeypatch.setattr(gantt, "gantt_figure", keep)
    s = sample_summary()
    s = replace(s, clock=replace(s.clock, time=time_kind))
    draw_gantt(s, tmp_path / "a.png")
    plan = S.PlanInfo("optimal", "envpipe", "planner", "d", 0.2, [["F0", "B0"]] * 2, None, None, [], False, True)
    draw_gantt(replace(s, plan=plan), tmp_path / "b.png")
    titles = [" ".join(fig.axes[0].get_title().split()) for fig in drawn]
    assert titles == [f"one iteration of 1F1B all-max ({label})",
                      f"one iteration of the plan (policy optimal, order envpipe) ({label})"]

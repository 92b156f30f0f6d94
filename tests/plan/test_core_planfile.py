from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from envpipe.atomicfile import new_file_mode
from envpipe.plan.case import PipelineCase
from envpipe.plan.evaluate import evaluate_plan
from envpipe.plan.planfile import Plan, PlanError, PlannedUnit
from envpipe.plan.planner import make_plan


@pytest.fixture()
def small(gpt3):
    case = PipelineCase.of(gpt3.with_stages(3), 6, 83.64)
    return case, make_plan(case, "envpipe", "envelope")


def test_plan_json_has_exactly_the_designed_keys_and_round_trips(small, tmp_path):
    case, result = small
    data = result.plan.to_json()
    assert set(data) == {"version", "num_stages", "num_microbatches", "schedule", "policy", "stages", "predicted",
                         "critical_path"}
    assert set(data["predicted"]) == {"iteration_time_s", "energy_j", "baseline_time_s", "baseline_energy_j"}
    assert data["stages"][0][0] == {"kind": "F", "mb": 0, "freq_mhz": 1410}
    path = tmp_path / "plan.json"
    result.plan.save(path)
    again = Plan.load(path)
    assert again.to_json() == json.loads(path.read_text())
    tl = evaluate_plan(again, case)
    assert tl.iteration_time == pytest.approx(data["predicted"]["iteration_time_s"], rel=1e-12)
    assert tl.energy == pytest.approx(data["predicted"]["energy_j"], rel=1e-12)
    assert [list(u) for u in data["critical_path"]] == [list(tl.dag.unit(i)) for i in tl.critical_path()]


def test_a_saved_plan_has_a_unit_per_line(small, tmp_path):
    """The file is the plan's JSON, written a unit (and a critical-path unit) per line by json's C encoder."""
    _, result = small
    plan = replace(result.plan, peak_memory_bytes=(3, 2, 1), profile_digest="sha256:" + "0" * 64)
    path = tmp_path / "plan.json"
    plan.save(path)
    text = path.read_text()
    assert json.loads(text) == plan.to_json() and text.endswith("}\n")
    units = [line.strip().rstrip(",") for line in text.splitlines() if '"kind"' in line]
    assert [json.loads(u) for u in units] == [u for stage in plan.to_json()["stages"] for u in stage]
    path_lines = [line.strip().rstrip(",") for line in text.splitlines() if line.startswith("  [") and '"' in line]
    assert [json.loads(u) for u in path_lines] == plan.to_json()["critical_path"]


def test_hand_written_plan_is_simulated(gpt3):
    profile = gpt3.with_stages(2)
    stages = [[PlannedUnit("F", 0, 1410), PlannedUnit("B", 0, 1005)],
              [PlannedUnit("F", 0, 1410), PlannedUnit("B", 0, 1410)]]
    tl = evaluate_plan(Plan(2, 1, "1f1b", "hand", stages), PipelineCase.of(profile, 1, 50.0))
    k = profile.freq_index(1005)
    expected = profile.fwd_time[0, 0] + profile.fwd_time[1, 0] + profile.bwd_time[1, 0] + profile.bwd_time[0, k]
    assert tl.iteration_time == pytest.approx(expected)
    units = profile.fwd_energy[0, 0] + profile.fwd_energy[1, 0] + profile.bwd_energy[1, 0] + profile.bwd_energy[0, k]
    idle = expected  # the units form one serial chain: 2 stages x T minus T of work
    assert tl.energy == pytest.approx(units + idle * 50.0)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=2), "unsupported plan version"),
        (lambda d: d.update(extra=1), "unknown key"),
        (lambda d: d.update(num_stages=0), "num_stages"),
        (lambda d: d.update(num_microbatches="6"), "num_microbatches"),
        (lambda d: d["stages"].pop(), "list of 3 stage lists"),
        (lambda d: d["stages"][0][0].update(kind="X"), "kind must be"),
        (lambda d: d["stages"][0][0].update(freq_mhz=-5), "freq_mhz must be"),
        (lambda d: d["stages"][0][0].update(speed=1), "must be"),
        (lambda d: d.update(predicted={"energy_j": "lots"}), "predicted"),
        (lambda d: d.update(critical_path=[[0, "Z", 1]]), "critical_path"),
        (lambda d: d.update(policy=3), "'policy' must be a string"),
    ],
)
def test_malformed_plans_are_refused(small, mutate, message):
    data = small[1].plan.to_json()
    mutate(data)
    with pytest.raises(PlanError, match=message):
        Plan.from_json(data)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["stages"][1][2].update(freq_mhz=1234), "1234 MHz is not a clock of the profile"),
        (lambda d: d["stages"][1].pop(), "missing unit"),
        (lambda d: d["stages"][2].reverse(), "deadlock"),
    ],
)
def test_inconsistent_plans_get_clear_errors(small, mutate, message):
    case, result = small
    data = result.plan.to_json()
    mutate(data)
    with pytest.raises(PlanError, match=message):
        evaluate_plan(Plan.from_json(data), case)
    with pytest.raises(PlanError, match="plan has 3 stages but the case has 4"):
        evaluate_plan(result.plan, PipelineCase.of(case.profile.with_stages(4), 6, 83.64))


def test_a_plan_builds_its_dag_once_and_keeps_it_across_clock_changes(small):
    _, result = small
    plan = Plan.from_json(result.plan.to_json())
    assert plan.dag is plan.dag  # cached
    assert plan.dag.num_microbatches == 6 and plan.dag.num_stages == 3
    faster = plan.with_clocks([[1410] * len(units) for units in plan.stages])
    assert faster.dag is plan.dag  # the same order: the same DAG
    assert replace(plan, policy="other").__dict__.get("dag") is None  # a new plan builds its own when asked


def test_unreadable_files(tmp_path):
    with pytest.raises(PlanError, match="cannot read"):
        Plan.load(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not JSON"):
        Plan.load(bad)


def test_save_is_atomic_and_leaves_nothing_behind_on_failure(small, tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    path.write_text("old")
    plan = small[1].plan
    monkeypatch.setattr(Plan, "to_json", lambda self: {"x": np.float32(1)})  # not JSON-serialisable
    with pytest.raises(TypeError):
        plan.save(path)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{{"version": true, {rest}', "unsupported plan version True"),  # JSON true == 1 in Python
        ('{{"version": 1.0, {rest}', "unsupported plan version 1.0"),
        ('{{"version": 1, "num_microbatches": 1000000000, {rest}',
         "'num_microbatches' must be an integer in [1, 65536]"),  # 119 GiB before
        ('{{"version": 1, "num_stages": 1025, {rest}', "'num_stages' must be an integer in [1, 1024]"),
        ('{{"version": 1, "extra": ' + deep(100_000) + ", {rest}", "nested deeper than 8 levels"),  # RecursionError
        ('{{"version": 1, "extra": ' + deep(50) + ", {rest}", "nested deeper than 8 levels"),
        ('{{"version": 1, "predicted": {{"energy_j": NaN}}, {rest}', "NaN is not a finite number"),
        ('{{"version": 1, "predicted": {{"energy_j": -Infinity}}, {rest}', "-Infinity is not a finite number"),
        ('{{"version": 1, "predicted": {{"energy_j": 1e999}}, {rest}', "number out of range: '1e999'"),
        ('{{"version": 1, "predicted": {{"energy_j": 1' + "0" * 5000 + "}}, {rest}", "integer out of range"),
        ('\ufeff{{"version": 2, {rest}', "unsupported plan version 2"),  # a BOM is fine, the version is not
    ],
)
def test_plan_files_with_bad_numbers_sizes_and_nesting_are_refused(small, tmp_path, text, message):
    data = small[1].plan.to_json()
    rest = json.dumps({k: v for k, v in data.items() if k not in ("version", "num_microbatches", "num_stages",
                                                                  "predicted")} | {"num_stages": 3,
                                                                                   "num_microbatches": 6})[1:]
    for key in ("num_stages", "num_microbatches"):  # a key given twice keeps the last: drop the default
        if f'"{key}"' in text:
            rest = rest.replace(f'"{key}": {data[key]}, ', "").replace(f', "{key}": {data[key]}', "")
    path = tmp_path / "plan.json"
    path.write_text(text.format(rest=rest), encoding="utf-8")
    with pytest.raises(PlanError) as err:
        Plan.load(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert len(str(err.value)) < 300 + len(str(path))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["stages"][0][0].update(mb=10**30), "mb must be an integer in [0, 5]"),  # OverflowError before
        (lambda d: d["stages"][0][0].update(mb=6), "mb must be an integer in [0, 5]"),
        (lambda d: d["stages"][0][0].update(mb=True), "mb must be an integer"),
        (lambda d: d["stages"][0][0].update(freq_mhz=10**30), "freq_mhz must be an integer in [1, 10000]"),
        (lambda d: d.update(critical_path=[[0, "F", 10**30]]), "'critical_path' must be a list of [stage < 3"),
        (lambda d: d.update(critical_path=[[True, "F", 0]]), "critical_path"),
        (lambda d: d["stages"][0].__setitem__(0, {"kind": "F", "mb": 0, "freq_mhz": 1410, "x": "y" * 10**6}),
         "stage 0 unit 0: must be {'kind', 'mb', 'freq_mhz'}, got {'freq_mhz': 1410, 'kind': 'F', 'mb': 0, "
         "'x': 'yyyyyyyyyyyyyyyyy...yyyyyyyyyyyyyyyyyy'}"),  # a 1 MB value, quoted in 40 characters
        (lambda d: d.update(profile_digest="md5:0"), "'profile_digest' must be 'sha256:' and 64 hex digits"),
        (lambda d: d.update(num_stages=1024, num_microbatches=65536), "131,072"),
    ],
)
def test_out_of_range_plan_fields_are_refused_in_short_messages(small, mutate, message):
    data = small[1].plan.to_json()
    mutate(data)
    with pytest.raises(PlanError) as err:
        Plan.from_json(data)
    assert message in str(err.value) and len(str(err.value)) < 300


def test_plans_record_their_profile_and_refuse_another(small, gpt3, tmp_path):
    case, result = small
    profile = case.profile
    plan = replace(result.plan, profile_digest=profile.digest)
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again.profile_digest == profile.digest and again.to_json() == plan.to_json()
    again.check_profile(profile)
    other = gpt3.with_stages(3).restricted(gpt3.freqs[:-1])
    with pytest.raises(PlanError, match="made from another profile"):
        again.check_profile(other)
    result.plan.check_profile(other)  # a plan without a digest (a hand-written one) is not checked


def test_save_creates_directories_and_files_others_can_read(small, tmp_path):
    path = tmp_path / "a" / "b" / "plan.json"
    small[1].plan.save(path)
    assert path.stat().st_mode & 0o777 == new_file_mode()  # mkstemp alone gave 0600
    assert Plan.load(path).to_json() == small[1].plan.to_json()
    with pytest.raises(OSError):
        small[1].plan.save(path / "under_a_file.json")
    assert sorted(p.name for p in path.parent.iterdir()) == ["plan.json"]
    nan_plan = replace(small[1].plan, predicted={"energy_j": float("nan")})
    with pytest.raises(ValueError):
        nan_plan.save(path)
    assert Plan.load(path).to_json() == small[1].plan.to_json()

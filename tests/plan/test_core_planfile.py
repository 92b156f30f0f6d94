from __future__ import annotations

import json

import numpy as np
import pytest

from envpipe.plan.planfile import Plan, PlanError, PlannedUnit, evaluate_plan
from envpipe.plan.planner import make_plan


@pytest.fixture()
def small(gpt3):
    profile = gpt3.with_stages(3)
    return profile, make_plan(profile, 6, schedule="envpipe", policy="envelope", reconfig="balanced",
                              idle_power_w=83.64)


def test_plan_json_has_exactly_the_designed_keys_and_round_trips(small, tmp_path):
    profile, result = small
    data = result.plan.to_json()
    assert set(data) == {"version", "num_stages", "num_microbatches", "schedule", "policy", "stages", "predicted",
                         "critical_path"}
    assert set(data["predicted"]) == {"iteration_time_s", "energy_j", "baseline_time_s", "baseline_energy_j"}
    assert data["stages"][0][0] == {"kind": "F", "mb": 0, "freq_mhz": 1410}
    path = tmp_path / "plan.json"
    result.plan.save(path)
    again = Plan.load(path)
    assert again.to_json() == json.loads(path.read_text())
    tl = evaluate_plan(again, profile, 83.64)
    assert tl.iteration_time == pytest.approx(data["predicted"]["iteration_time_s"], rel=1e-12)
    assert tl.energy == pytest.approx(data["predicted"]["energy_j"], rel=1e-12)
    assert [list(u) for u in data["critical_path"]] == [list(tl.dag.unit(i)) for i in tl.critical_path()]


def test_hand_written_plan_is_simulated(gpt3):
    profile = gpt3.with_stages(2)
    stages = [[PlannedUnit("F", 0, 1410), PlannedUnit("B", 0, 1005)],
              [PlannedUnit("F", 0, 1410), PlannedUnit("B", 0, 1410)]]
    tl = evaluate_plan(Plan(2, 1, "1f1b", "hand", stages), profile, 50.0)
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
    profile, result = small
    data = result.plan.to_json()
    mutate(data)
    with pytest.raises(PlanError, match=message):
        evaluate_plan(Plan.from_json(data), profile, 83.64)
    with pytest.raises(PlanError, match="plan has 3 stages but the profile has 4"):
        evaluate_plan(result.plan, profile.with_stages(4), 83.64)


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
    monkeypatch.setattr(plan, "to_json", lambda: {"x": np.float32(1)})  # not JSON-serialisable
    with pytest.raises(TypeError):
        plan.save(path)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]

"""Plan files, EnvPipe's reschedule rule, and the summary/Gantt report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envpipe.plan.schedules import envpipe_schedule, one_f_one_b, reschedule_counts
from envpipe.runtime.engine import UnitRecord
from envpipe.runtime.plans import PlanFileError, builtin_plan, load_plan
from envpipe.runtime.report import StageReport, summarize, write_summary


def plan_json(orders, clocks=1410, **extra) -> dict:
    return {
        "version": 1,
        "num_stages": len(orders),
        "num_microbatches": len(orders[0]) // 2,
        "schedule": "envpipe",
        "policy": "envelope",
        "stages": [[{"kind": k, "mb": m, "freq_mhz": clocks} for k, m in o] for o in orders],
        "predicted": {
            "iteration_time_s": 1.5,
            "energy_j": 10.0,
            "baseline_time_s": 1.4,
            "baseline_energy_j": 12.0,
        },
        "critical_path": [],
        **extra,
    }


def test_load_plan(tmp_path: Path) -> None:
    orders = envpipe_schedule(2, 4, [2, 0])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_json(orders, 1200)))
    plan = load_plan(path, 2, 4)
    assert plan.orders == orders and plan.clocks == [[1200] * 8, [1200] * 8]
    assert plan.predicted_time_s == 1.5 and plan.baseline == {"time_s": 1.4, "energy_j": 12.0}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{nope", "not JSON"),
        (json.dumps({"version": 2}), "not a version 1 plan"),
        (
            json.dumps(plan_json(one_f_one_b(4, 4))),
            "plan is for 4 stages x 4 micro-batches, this run has 2 x 4",
        ),
        (json.dumps({**plan_json(one_f_one_b(2, 4)), "stages": [[{"kind": "F"}], []]}), "must list units"),
    ],
)
def test_bad_plan_files(tmp_path: Path, content, message) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PlanFileError, match=message):
        load_plan(path, 2, 4)


def test_plan_that_breaks_engine_constraints(tmp_path: Path) -> None:
    bad = [one_f_one_b(2, 2)[0], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_json(bad)))
    with pytest.raises(PlanFileError, match="directly follow"):
        load_plan(path, 2, 2)


def test_reschedule_counts_follow_envpipe() -> None:
    # Tb = 2 Tf: stage s can fill 2 (P-s-1) forwards, capped at M-(P-s); last stage 0
    assert reschedule_counts([2, 2, 2, 2], [1, 1, 1, 1], 16) == [6, 4, 2, 0]
    assert reschedule_counts([2, 2, 2, 2], [1, 1, 1, 1], 4) == [0, 1, 2, 0]
    assert builtin_plan("envpipe", 4, 16, [1] * 4, [2] * 4).orders == envpipe_schedule(4, 16, [6, 4, 2, 0])
    assert builtin_plan("1f1b", 2, 4).orders == one_f_one_b(2, 4)
    with pytest.raises(ValueError, match="measured"):
        builtin_plan("envpipe", 2, 4)


def _stage(s: int, times, energies) -> StageReport:
    units = [UnitRecord("F", 0, 0.0 + s, 0.5 + s, 1410), UnitRecord("B", 0, 1.0 + s, 2.0 + s, None)]
    return StageReport(s, list(times), list(energies), 1000 * (s + 1), units)


def test_summary_and_gantt(tmp_path: Path) -> None:
    stages = [_stage(0, [1.0, 2.0, 3.0], [10.0, 20.0, 30.0]), _stage(1, [1.5, 2.0, 2.0], [5.0, 6.0, 7.0])]
    s = summarize(stages, 64, "simulated", 2.0, {"time_s": 1.9, "energy_j": 40.0})
    assert s["iteration_time_s"] == 2.0  # median over iterations of the slowest stage: 1.5, 2, 3
    assert s["throughput_samples_per_s"] == 32.0
    assert s["energy_per_gpu_j"] == [20.0, 6.0] and s["energy_per_iteration_j"] == 26.0
    assert s["energy_saving_vs_baseline"] == pytest.approx(1 - 26 / 40)
    assert s["predicted_error"] == 0.0 and s["peak_memory_bytes_per_stage"] == [1000, 2000]
    write_summary(tmp_path, s, stages, "test")
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["units_last_iteration"][1][0] == {
        "kind": "F",
        "mb": 0,
        "start_s": 1.0,
        "end_s": 1.5,
        "mhz": 1410,
    }
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_without_energy() -> None:
    s = summarize([_stage(0, [1.0], [None])], 8, "none", None, None)
    assert s["energy_per_iteration_j"] is None and s["predicted_error"] is None and "baseline" not in s


def test_profile_clocks_spread_over_supported() -> None:
    from envpipe.runtime.runner import profile_clocks

    assert profile_clocks([1410, 1395, 1380, 1365, 1350], 3) == [1410, 1380, 1350]
    assert profile_clocks([1005, 1410], 4) == [1410, 1005]
    assert profile_clocks([1410, 1200], 1) == [1410]

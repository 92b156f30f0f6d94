"""Real DeepSpeed pipelines (gloo, CPU, one process per stage): EnvPipe orders vs stock 1F1B."""

from __future__ import annotations

from pathlib import Path

import pytest

from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from tests.support.pipelines import orders_json, run_pipeline


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 4])
def test_envpipe_schedule_matches_stock_1f1b_and_never_deadlocks(stages: int, tmp_path: Path) -> None:
    M, steps = 4, 3
    full = [M] * stages  # every non-last stage runs all its forwards first: the most in-flight sends
    runs = [
        {"name": "stock", "engine": "stock", "M": M, "steps": steps, "orders": None},
        {
            "name": "1f1b",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": orders_json(one_f_one_b(stages, M)),
        },
        {
            "name": "envpipe",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": orders_json(envpipe_schedule(stages, M, [1] * stages)),
        },
        {
            "name": "envpipe_full",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": orders_json(envpipe_schedule(stages, M, full)),
        },
    ]
    for extra_m in (8, 16):
        runs.append(
            {
                "name": f"envpipe_full_M{extra_m}",
                "engine": "envpipe",
                "M": extra_m,
                "steps": 1,
                "orders": orders_json(envpipe_schedule(stages, extra_m, [extra_m] * stages)),
            }
        )
        runs.append(
            {
                "name": f"envpipe_r1_M{extra_m}",
                "engine": "envpipe",
                "M": extra_m,
                "steps": 1,
                "orders": orders_json(envpipe_schedule(stages, extra_m, [1] * stages)),
            }
        )
    results = run_pipeline(stages, runs, tmp_path)
    last = results[-1]
    assert last["stock"]["engine"] == "PipelineEngine" and last["envpipe"]["engine"] == "EnvPipeEngine"
    assert len(last["stock"]["losses"]) == steps
    assert last["stock"]["losses"][0] != last["stock"]["losses"][-1]  # it trains
    for name in ("1f1b", "envpipe", "envpipe_full"):
        assert last[name]["losses"] == pytest.approx(last["stock"]["losses"], rel=1e-6, abs=1e-7)
        for rank in results:  # every stage's parameters after the steps
            for pname, values in rank["stock"]["params"].items():
                assert rank[name]["params"][pname] == pytest.approx(values, rel=1e-5, abs=1e-6), (name, pname)
    for extra_m in (8, 16):
        for name in (f"envpipe_full_M{extra_m}", f"envpipe_r1_M{extra_m}"):
            assert len(last[name]["losses"]) == 1


@pytest.mark.slow
def test_two_data_parallel_pipelines(tmp_path: Path) -> None:
    """2 stages x 2 data-parallel replicas: the per-direction groups of both pipelines stay apart."""
    M, steps = 4, 2
    runs = [
        {"name": "stock", "engine": "stock", "M": M, "steps": steps, "orders": None},
        {
            "name": "envpipe",
            "engine": "envpipe",
            "M": M,
            "steps": steps,
            "orders": orders_json(envpipe_schedule(2, M, [M, 0])),
        },
    ]
    results = run_pipeline(2, runs, tmp_path, world=4)
    for rank in results:
        for pname, values in rank["stock"]["params"].items():
            assert rank["envpipe"]["params"][pname] == pytest.approx(values, rel=1e-5, abs=1e-6), pname
        assert rank["envpipe"]["losses"] == pytest.approx(rank["stock"]["losses"], rel=1e-6, abs=1e-7)

"""Stage units replayed as recordings inside real DeepSpeed pipelines (gloo, CPU, one process per stage), with the
CPU recorder that behaves as CUDA graphs do (tests/support/fakes/graphs.py): the same training as stock DeepSpeed,
one recording per micro-batch a stage has in flight, in 1F1B and in EnvPipe's orders."""

from __future__ import annotations

from pathlib import Path

import pytest

from envpipe.plan.memory import peak_in_flight
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from tests.support.pipelines import orders_json, run_pipeline

M, STEPS = 4, 3


@pytest.mark.slow
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_graphed_units_train_as_stock_deepspeed_does(stages: int, tmp_path: Path) -> None:
    orders = {"1f1b": one_f_one_b(stages, M), "envpipe_full": envpipe_schedule(stages, M, [M] * stages)}
    runs = [{"name": "stock", "engine": "stock", "M": M, "steps": STEPS, "orders": None}]
    runs += [{"name": name, "engine": "envpipe", "M": M, "steps": STEPS, "orders": orders_json(order), "graphs": True}
             for name, order in orders.items()]
    runs.append({"name": "runtime", "engine": "runtime", "M": M, "steps": 12, "graphs": True,
                 "envpipe": {"calibration_iterations": 3, "compare_iterations": 2, "profile_points": 2}})
    runs.append({"name": "runtime_stock", "engine": "stock", "M": M, "steps": "as:runtime", "orders": None})
    # ZeRO-1 writes the updated parameters back into their storage, which the recordings read
    runs.append({"name": "zero1_stock", "engine": "stock", "M": M, "steps": STEPS, "orders": None, "zero": 1})
    runs.append({"name": "zero1", "engine": "envpipe", "M": M, "steps": STEPS, "orders": orders_json(orders["1f1b"]),
                 "zero": 1, "graphs": True})
    # bf16: DeepSpeed's BF16_Optimizer, its hand-off to the fp32 accumulators batched (envpipe.runtime.engine.hp_grads)
    runs.append({"name": "bf16_stock", "engine": "stock", "M": M, "steps": STEPS, "orders": None, "bf16": True})
    runs.append({"name": "bf16", "engine": "envpipe", "M": M, "steps": STEPS, "orders": orders_json(orders["1f1b"]),
                 "bf16": True, "graphs": True})
    results = run_pipeline(stages, runs, tmp_path)
    last = results[-1]
    for name in orders:
        assert last[name]["losses"] == pytest.approx(last["stock"]["losses"], rel=1e-6, abs=1e-7), name
    assert last["runtime"]["losses"] == pytest.approx(last["runtime_stock"]["losses"], rel=1e-6, abs=1e-7)
    assert last["zero1"]["losses"] == pytest.approx(last["zero1_stock"]["losses"], rel=1e-6, abs=1e-7)
    assert last["zero1"]["losses"][0] != last["zero1"]["losses"][-1]  # it trains
    assert last["bf16"]["losses"] == last["bf16_stock"]["losses"]  # the same fp32 sums, bit for bit
    for stage, rank in enumerate(results):
        for name, order in orders.items():
            for pname, values in rank["stock"]["params"].items():
                assert rank[name]["params"][pname] == pytest.approx(values, rel=1e-5, abs=1e-6), (name, pname)
            assert rank[name]["recorded"] == peak_in_flight([order[stage]])[0], (name, stage)
            assert rank[name]["replays"] == [M * STEPS, M * STEPS], (name, stage)
            assert rank[name]["recordings_made"] == rank[name]["recorded"], (name, stage)  # none made again
        assert rank["zero1"]["recordings_made"] == rank["zero1"]["recorded"] >= 1  # ZeRO-1 keeps the storage
        assert rank["bf16"]["hp_grads_batched"] and not rank["bf16_stock"]["hp_grads_batched"]
        assert rank["bf16"]["params"] == rank["bf16_stock"]["params"]
        assert rank["runtime"]["recorded"] >= 1
        assert rank["runtime"]["released_after"] == [0]  # the metering iteration's cache, before any recording
        assert all(rank[name]["released_after"] == [] for name in orders)  # nothing eager: nothing given back
        forwards, backwards = rank["runtime"]["replays"]
        assert forwards == backwards and 0 < forwards < M * 12  # the metering iteration runs eagerly

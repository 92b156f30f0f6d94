"""Unit orders, their validation (one validator: envpipe.plan.dag.engine_order_dag), and the DeepSpeed
instructions they become."""

from __future__ import annotations

import numpy as np
import pytest
from deepspeed.runtime.pipe import schedule as ds

from envpipe.plan.dag import ScheduleError, engine_order_dag
from envpipe.plan.memory import peak_in_flight
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from envpipe.plan.simulate import Overheads, simulate
from envpipe.runtime.engine.schedule import (
    ISendActivation,
    ISendGrad,
    SetClock,
    Stock1F1BSchedule,
    TailMark,
    UnitEnd,
    UnitExtras,
    UnitOrderSchedule,
    UnitStart,
)


def test_one_f_one_b_is_deepspeeds_order() -> None:
    for P, M in [(2, 4), (4, 8), (4, 2)]:
        for s in range(P):
            stock = ds.TrainSchedule(micro_batches=M, stages=P, stage_id=s)
            units = []
            for step in stock:
                for cmd in step:
                    if isinstance(cmd, ds.ForwardPass | ds.BackwardPass):
                        units.append(("F" if isinstance(cmd, ds.ForwardPass) else "B", None))
            ours = one_f_one_b(P, M)[s]
            assert [k for k, _ in ours] == [k for k, _ in units], (P, M, s)


def test_envpipe_schedule_warmup_counts() -> None:
    orders = envpipe_schedule(4, 8, [2, 1, 0, 5])
    warmups = [next(i for i, (k, _) in enumerate(o) if k == "B") for o in orders]
    assert warmups == [6, 4, 2, 1]  # min(M, P - s + r_s); the last stage stays 1F1B
    assert envpipe_schedule(2, 4, [9, 0])[0] == [("F", m) for m in range(4)] + [("B", m) for m in range(4)]
    engine_order_dag(orders, 8)


@pytest.mark.parametrize("P", [2, 3, 4, 6])
@pytest.mark.parametrize("M", [1, 4, 8, 16])
def test_all_envpipe_schedules_validate(P: int, M: int) -> None:
    for r in range(M + 1):
        engine_order_dag(envpipe_schedule(P, M, [r] * P), M)


def test_bad_orders_are_refused() -> None:
    good = one_f_one_b(2, 2)
    with pytest.raises(ScheduleError, match="F units in micro-batch order"):
        engine_order_dag([[("F", 1), ("F", 0), ("B", 0), ("B", 1)], good[1]], 2)
    with pytest.raises(ScheduleError, match="deadlocks"):  # B0 before F0: it waits on itself
        engine_order_dag([[("B", 0), ("F", 0), ("F", 1), ("B", 1)], good[1]], 2)
    with pytest.raises(ScheduleError, match="directly follow"):
        engine_order_dag([good[0], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]], 2)
    with pytest.raises(ScheduleError, match="unit X0 is not a unit"):
        engine_order_dag([[("X", 0), *good[0][1:]], good[1]], 2)
    with pytest.raises(ValueError, match="reschedule"):
        envpipe_schedule(2, 4, [1])


def test_deadlocking_orders_are_refused() -> None:
    # stage 2 wants F4 before its first backward, but stage 1 only sends F4 after B0 comes back.
    orders = envpipe_schedule(4, 8, [2, 1, 3, 0])
    with pytest.raises(ScheduleError, match=r"deadlocks.*stage 2 at F4"):
        engine_order_dag(orders, 8)


def test_buffers_cover_in_flight_forwards() -> None:
    order = envpipe_schedule(2, 8, [8, 0])[0]
    assert peak_in_flight([order]) == [8]
    assert UnitOrderSchedule(order, 8, 2, 0).num_pipe_buffers() == 8
    assert UnitOrderSchedule(one_f_one_b(2, 8)[1], 8, 2, 1).num_pipe_buffers() == 2


def test_instructions_and_clock_changes() -> None:
    order = one_f_one_b(2, 2)[0]
    sched = UnitOrderSchedule(order, 2, 2, 0, UnitExtras(clocks=[1410, 1410, 1200, 1410]))
    steps = list(sched)
    names = [[type(c).__name__ for c in step] for step in steps]
    assert names[0] == ["SetClock", "LoadMicroBatch", "ForwardPass", "ISendActivation"]
    assert names[1] == ["LoadMicroBatch", "ForwardPass", "ISendActivation"]  # same clock: no request
    assert names[2] == ["SetClock", "IRecvGrad", "BackwardPass"]
    assert [c.kwargs["mhz"] for s in steps for c in s if isinstance(c, SetClock)] == [1410, 1200, 1410]
    assert names[-1] == ["ReduceTiedGrads", "ReduceGrads", "OptimizerStep"]
    mid = list(UnitOrderSchedule(one_f_one_b(3, 2)[1], 2, 3, 1))
    assert any(isinstance(c, ISendGrad) for s in mid for c in s)
    assert any(isinstance(c, ISendActivation) for s in mid for c in s)
    with pytest.raises(ScheduleError, match="3 clocks for 4 units"):
        UnitOrderSchedule(order, 2, 2, 0, UnitExtras(clocks=[1, 2, 3]))


def test_simulated_1f1b_iteration_time() -> None:
    # P stages, F=1, B=2: 1F1B takes (M + P - 1) * (F + B)
    for P, M in [(2, 4), (4, 8)]:
        dag = engine_order_dag(one_f_one_b(P, M), M)
        dur = [1.0 if f else 2.0 for f in dag.is_fwd]
        tl = simulate(dag, np.asarray(dur), np.zeros(dag.num_units), Overheads.broadcast(dag.num_stages, 0.0))
        assert tl.iteration_time == pytest.approx((M + P - 1) * 3.0)


@pytest.mark.parametrize(("P", "M"), [(2, 4), (4, 8), (3, 2)])
def test_stock_1f1b_steps_are_deepspeeds_with_clock_and_timing_marks(P: int, M: int) -> None:
    """Without clocks or timing, exactly TrainSchedule's steps; with them, only our marks are added: a
    SetClock where the planned clock changes, UnitStart/UnitEnd around each unit with its micro-batch."""
    marks = (SetClock, UnitStart, UnitEnd, TailMark)
    for s in range(P):
        stock = [[repr(c) for c in step] for step in ds.TrainSchedule(micro_batches=M, stages=P, stage_id=s)]
        assert [[repr(c) for c in step] for step in Stock1F1BSchedule(M, P, s)] == stock
        order = one_f_one_b(P, M)[s]
        clocks = [1410 if k == "F" else 1200 for k, _ in order]
        steps = list(Stock1F1BSchedule(M, P, s, UnitExtras(clocks=clocks, timed=True)))
        assert [[repr(c) for c in step if not isinstance(c, marks)] for step in steps] == stock
        units = [(c.kwargs["kind"], c.kwargs["mb"]) for step in steps for c in step if isinstance(c, UnitStart)]
        assert units == order  # the i-th unit of DeepSpeed's steps is unit i of our 1F1B order
        asked = [c.kwargs["mhz"] for step in steps for c in step if isinstance(c, SetClock)]
        expected = [c for i, c in enumerate(clocks) if i == 0 or clocks[i - 1] != c]
        assert asked == expected
    with pytest.raises(ScheduleError, match="3 clocks for 8 units"):
        Stock1F1BSchedule(4, 2, 0, UnitExtras(clocks=[1, 2, 3]))

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envpipe.plan.dag import DeadlockError, PipelineDag, ScheduleError
from envpipe.plan.schedules import build_schedule, envpipe_schedule, one_f_one_b, reschedule_counts
from envpipe.plan.simulate import Overheads, resimulate, simulate


def costs(dag: PipelineDag, blocking_w: float | list[float] = 5.0, transfer: float = 0.0,
          tail: float | list[float] | np.ndarray = 0.0, tail_w: list[float] | None = None) -> Overheads:
    return Overheads.broadcast(dag.num_stages, blocking_w, transfer, tail, tail_w)


def two_by_two(transfer: float = 0.0):
    dag = PipelineDag.from_orders(one_f_one_b(2, 2), 2)
    dur = np.where(dag.is_fwd, 1.0, 2.0)
    return dag, simulate(dag, dur, 10 * dur, costs(dag, transfer=transfer))


def test_hand_computed_two_stages_two_microbatches():
    dag, tl = two_by_two()
    # S0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9];  S1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]
    at = {dag.unit(i): (tl.start[i], tl.end[i]) for i in range(dag.num_units)}
    assert at[(0, "F", 0)] == (0, 1) and at[(0, "F", 1)] == (1, 2)
    assert at[(1, "F", 0)] == (1, 2) and at[(1, "B", 0)] == (2, 4)
    assert at[(1, "F", 1)] == (4, 5) and at[(1, "B", 1)] == (5, 7)
    assert at[(0, "B", 0)] == (4, 6) and at[(0, "B", 1)] == (7, 9)
    assert tl.iteration_time == 9
    assert list(tl.busy_time) == [6, 6] and list(tl.idle_time) == [3, 3]
    # 120 J of units + 2 stages x 3 s idle x 5 W
    assert tl.energy == pytest.approx(150.0)
    assert tl.wait[dag.index(0, "B", 0)] == 2 and tl.wait[dag.index(1, "F", 0)] == 1
    assert [dag.unit(i) for i in tl.critical_path()] == [
        (0, "F", 0), (1, "F", 0), (1, "B", 0), (1, "F", 1), (1, "B", 1), (0, "B", 1)]


def test_hand_computed_with_transfer_time():
    dag, tl = two_by_two(transfer=0.5)
    at = {dag.unit(i): (tl.start[i], tl.end[i]) for i in range(dag.num_units)}
    assert at[(1, "F", 0)] == (1.5, 2.5)
    assert at[(0, "B", 0)] == (5.0, 7.0)  # gradient of B0 leaves stage 1 at 4.5, arrives 5.0
    assert at[(0, "B", 1)] == (8.0, 10.0)
    assert tl.iteration_time == 10
    assert tl.energy == pytest.approx(120 + 2 * 4 * 5.0)
    # the recv stall of stage 0's B0 is from F1's end (2) to the gradient's arrival (5)
    assert tl.dependency_wait[dag.index(0, "B", 0)] == pytest.approx(3.0)
    assert tl.dependency_wait[dag.index(1, "B", 0)] == 0  # last stage: no recv before B


def test_tails_end_the_iteration_after_each_stage_s_last_unit():
    dag = PipelineDag.from_orders(one_f_one_b(2, 2), 2)
    dur = np.where(dag.is_fwd, 1.0, 2.0)
    # stage 0 ends at 9, stage 1 at 7 (test above): a 1.5 s tail on stage 1 fits in its 2 s of slack
    tl = simulate(dag, dur, 10 * dur, costs(dag, tail=[0.0, 1.5]))
    assert list(tl.stage_end) == [9, 7] and tl.iteration_time == 9
    # a 3 s tail on stage 1 ends the iteration at 10, and that stage's last unit ends the critical path
    tl = simulate(dag, dur, 10 * dur, costs(dag, tail=np.array([0.5, 3.0])))
    assert tl.iteration_time == 10
    assert dag.unit(tl.critical_path()[-1]) == (1, "B", 1)
    assert tl.energy == pytest.approx(120 + 2 * 4 * 5.0)  # tails at the blocking power by default
    # one number applies to every stage
    assert simulate(dag, dur, 10 * dur, costs(dag, tail=0.25)).iteration_time == 9.25


def test_every_phase_at_its_own_power_per_stage():
    """Units at their energy, waits at each stage's blocking power, tails at each stage's tail power."""
    dag = PipelineDag.from_orders(one_f_one_b(2, 2), 2)
    dur = np.where(dag.is_fwd, 1.0, 2.0)
    # iteration 10 s (stage 1's 3 s tail after its end at 7); busy 6 s each, so idle 4 s each, of which
    # stage 0 waits 3.5 s and tails 0.5 s, stage 1 waits 1 s and tails 3 s
    tl = simulate(dag, dur, 10 * dur, costs(dag, blocking_w=[5.0, 7.0], tail=[0.5, 3.0], tail_w=[100.0, 50.0]))
    assert tl.iteration_time == 10
    expected = [60 + 3.5 * 5 + 0.5 * 100, 60 + 1 * 7 + 3 * 50]
    assert tl.stage_energy == pytest.approx(expected)
    assert tl.energy == pytest.approx(sum(expected))
    # tail power = blocking power: the tail counts like a bubble, to the last bit
    plain = simulate(dag, dur, 10 * dur, costs(dag, tail=[0.5, 3.0]))
    same = simulate(dag, dur, 10 * dur, costs(dag, tail=[0.5, 3.0], tail_w=[5.0, 5.0]))
    assert plain.energy == same.energy == float(plain.unit_energy.sum() + plain.idle_time.sum() * 5.0)
    assert list(plain.stage_energy) == list(same.stage_energy)


@pytest.mark.parametrize(("tail", "message"), [([1.0], "1 tail times given for 2 stages"),
                                               ([0.0, -1.0], "not negative"), (float("nan"), "finite")])
def test_bad_tails_are_refused(tail, message):
    dag = PipelineDag.from_orders(one_f_one_b(2, 2), 2)
    with pytest.raises(ValueError, match=message):
        simulate(dag, np.ones(dag.num_units), np.ones(dag.num_units), costs(dag, tail=tail))


def test_single_stage_is_serial():
    dag = PipelineDag.from_orders(one_f_one_b(1, 3), 3)
    tl = simulate(dag, np.arange(1, 7, dtype=float), np.zeros(6), costs(dag, 100.0))
    assert tl.iteration_time == 21 and tl.energy == 0 and tl.idle_time[0] == 0


def test_deadlocking_and_malformed_schedules_are_rejected():
    with pytest.raises(DeadlockError, match="stage 0 at B0"):
        PipelineDag.from_orders(envpipe_schedule(4, 8, [0, 3, 0, 0]), 8)
    with pytest.raises(DeadlockError):  # last stage running B0 before its own F0
        PipelineDag.from_orders([[("B", 0), ("F", 0)]], 1)
    with pytest.raises(ScheduleError, match="appears twice"):
        PipelineDag.from_orders([[("F", 0), ("F", 0), ("B", 0)]], 1)
    with pytest.raises(ScheduleError, match="missing unit"):
        PipelineDag.from_orders([[("F", 0)]], 1)
    with pytest.raises(ScheduleError, match="not a unit"):
        PipelineDag.from_orders([[("F", 0), ("B", 0), ("F", 7)]], 1)
    with pytest.raises(ValueError, match="negative"):
        Overheads.broadcast(1, 1.0, -1.0)
    with pytest.raises(ValueError, match="blocking powers must be finite and not negative"):
        Overheads.broadcast(2, [1.0, -1.0])
    with pytest.raises(ValueError, match="3 tail powers given for 2 stages"):
        Overheads.broadcast(2, 1.0, tail_power_w=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="overheads are given for 2 stages, the pipeline has 1"):
        simulate(PipelineDag.from_orders(one_f_one_b(1, 1), 1), np.ones(2), np.ones(2), Overheads.broadcast(2, 1.0))


schedules = st.tuples(st.integers(1, 6), st.integers(1, 12), st.sampled_from(["1f1b", "gpipe", "envpipe"]),
                      st.lists(st.floats(0.1, 5.0), min_size=12, max_size=12), st.integers(0, 4) | st.none())


@settings(max_examples=150, deadline=None)
@given(schedules)
def test_every_schedule_has_each_unit_once_and_never_deadlocks(case):
    S, M, name, times, cap = case
    r = reschedule_counts(times[:S], times[6:6 + S], M, cap) if name == "envpipe" else None
    orders = build_schedule(name, S, M, r)
    for order in orders:
        assert sorted(order) == sorted([("F", m) for m in range(M)] + [("B", m) for m in range(M)])
    dag = PipelineDag.from_orders(orders, M)  # raises DeadlockError on a cycle
    assert dag.num_units == 2 * S * M and len(dag.topo) == 2 * S * M


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.integers(1, 10), st.integers(0, 10_000), st.floats(0, 0.3))
def test_raising_a_clock_never_lengthens_the_iteration(S, M, seed, transfer):
    """With unit time non-increasing in clock (as on a GPU), raising any clock cannot slow the iteration."""
    rng = np.random.default_rng(seed)
    dag = PipelineDag.from_orders(build_schedule("1f1b", S, M), M)
    clocks = np.array([1410, 1200, 1000, 800])
    base = rng.uniform(0.1, 2.0, dag.num_units)
    time_at = lambda f: base * 1410 / f  # noqa: E731
    freqs = rng.choice(clocks, dag.num_units)
    before = simulate(dag, time_at(freqs), np.zeros(dag.num_units), costs(dag, 0.0, transfer)).iteration_time
    unit = rng.integers(dag.num_units)
    higher = clocks[clocks > freqs[unit]]
    if higher.size:
        freqs[unit] = rng.choice(higher)
    after = simulate(dag, time_at(freqs), np.zeros(dag.num_units), costs(dag, 0.0, transfer)).iteration_time
    assert after <= before + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 10), st.integers(0, 10_000))
def test_vectorised_simulation_matches_event_by_event_reference(S, M, seed):
    rng = np.random.default_rng(seed)
    r = [int(x) for x in rng.integers(0, 4, S)]
    r = reschedule_counts([1.0] * S, [1.0 / (x + 1) for x in r], M)
    dag = PipelineDag.from_orders(build_schedule("envpipe", S, M, r), M)
    dur = rng.uniform(0.1, 1.0, dag.num_units)
    tl = simulate(dag, dur, dur, costs(dag, 1.0, 0.05))
    end = np.zeros(dag.num_units + 1)
    for i in dag.topo:  # the plain definition, one unit at a time
        data = end[dag.pred_data[i]] + (0.05 if dag.data_crosses[i] else 0.0)
        end[i] = max(end[dag.pred_same[i]], data) + dur[i]
    assert np.allclose(tl.end, end[:-1])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 10), st.integers(0, 10_000), st.floats(0, 0.2))
def test_incremental_resimulation_equals_full(S, M, seed, transfer):
    rng = np.random.default_rng(seed)
    dag = PipelineDag.from_orders(build_schedule("1f1b", S, M), M)
    dur = rng.uniform(0.1, 1.0, dag.num_units)
    before = simulate(dag, dur, dur, costs(dag, 2.0, transfer))
    changed = rng.choice(dag.num_units, size=min(dag.num_units, int(rng.integers(0, 4))), replace=False)
    dur2 = dur.copy()
    dur2[changed] *= rng.uniform(0.3, 1.5, changed.size)
    full = simulate(dag, dur2, dur2, costs(dag, 2.0, transfer))
    quick = resimulate(before, dur2, dur2, changed)
    assert np.allclose(full.end, quick.end) and np.allclose(full.start, quick.start)
    assert full.energy == pytest.approx(quick.energy)

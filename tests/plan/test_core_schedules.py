from __future__ import annotations

import importlib.util

import pytest

from envpipe.plan.schedules import build_schedule, envpipe_schedule, gpipe, one_f_one_b, reschedule_counts


def fmt(order):
    return " ".join(f"{k}{m}" for k, m in order)


def test_1f1b_p4_m4_matches_research_notes():
    assert [fmt(o) for o in one_f_one_b(4, 4)] == [
        "F0 F1 F2 F3 B0 B1 B2 B3",
        "F0 F1 F2 B0 F3 B1 B2 B3",
        "F0 F1 B0 F2 B1 F3 B2 B3",
        "F0 B0 F1 B1 F2 B2 F3 B3",
    ]


def test_worked_example_p4_m4_with_recomputation():
    # Tb(fmax) >= 2 Tf(fopt): raw r = floor(2 * (3, 2, 1)) capped by M-(P-s) = (0, 1, 2)
    r = reschedule_counts([2.0] * 4, [1.0] * 4, 4)
    assert r == [0, 1, 2, 0]
    assert [fmt(o) for o in envpipe_schedule(4, 4, r)] == [
        "F0 F1 F2 F3 B0 B1 B2 B3",
        "F0 F1 F2 F3 B0 B1 B2 B3",
        "F0 F1 F2 F3 B0 B1 B2 B3",
        "F0 B0 F1 B1 F2 B2 F3 B3",
    ]


def test_worked_example_p4_m4_without_recomputation():
    # Tf(opt) <= Tb < 2 Tf(opt): r = [0, 1, 1, 0] and stage 2 becomes F0 F1 F2 B0 F3 B1 B2 B3
    r = reschedule_counts([1.5] * 4, [1.0] * 4, 4)
    assert r == [0, 1, 1, 0]
    assert fmt(envpipe_schedule(4, 4, r)[2]) == "F0 F1 F2 B0 F3 B1 B2 B3"


def test_worked_example_p4_m8():
    # Tb(fmax) = 2 Tf(fmax), Tf(fopt) = 1.25 Tf(fmax): raw r = floor(1.6 * (3, 2, 1)) = [4, 3, 1]
    r = reschedule_counts([2.0] * 4, [1.25] * 4, 8)
    assert r == [4, 3, 1, 0]
    assert [fmt(o) for o in envpipe_schedule(4, 8, r)] == [
        "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7",
        "F0 F1 F2 F3 F4 F5 B0 F6 B1 F7 B2 B3 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    ]


def test_reschedule_memory_cap_and_monotonic_rule():
    assert reschedule_counts([2.0] * 4, [1.25] * 4, 8, memory_cap=2) == [2, 2, 1, 0]
    assert reschedule_counts([2.0] * 4, [1.25] * 4, 8, memory_cap=[0, 3, 3, 3]) == [0, 0, 0, 0]
    # a saturated upstream stage (r_i + P - i == M) does not force the next one down
    assert reschedule_counts([4.0] * 3, [1.0] * 3, 5) == [2, 3, 0]
    # a slow forward at the valley clock leaves nothing to fill
    assert reschedule_counts([1.0] * 4, [10.0] * 4, 16) == [0, 0, 0, 0]
    with pytest.raises(ValueError):
        reschedule_counts([1.0] * 4, [1.0] * 3, 8)


def test_gpipe_and_bad_names():
    assert fmt(gpipe(2, 3)[1]) == "F0 F1 F2 B0 B1 B2"
    with pytest.raises(ValueError, match="unknown schedule"):
        build_schedule("zigzag", 2, 2)
    with pytest.raises(ValueError, match="at least 1"):
        build_schedule("1f1b", 0, 2)
    assert build_schedule("envpipe", 3, 6) == one_f_one_b(3, 6)  # r = 0 everywhere is 1F1B


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
@pytest.mark.parametrize(("stages", "micro"), [(1, 3), (2, 2), (2, 5), (4, 4), (4, 9), (8, 12), (5, 3)])
def test_1f1b_equals_installed_deepspeed_trainschedule(stages, micro):
    from deepspeed.runtime.pipe import schedule as ds

    for s in range(stages):
        kinds = []
        for cmds in ds.TrainSchedule(micro_batches=micro, stages=stages, stage_id=s).steps():
            kinds += ["F" for c in cmds if isinstance(c, ds.ForwardPass)]
            kinds += ["B" for c in cmds if isinstance(c, ds.BackwardPass)]
        # DeepSpeed runs forwards and backwards each in micro-batch order: number them by count
        counts = {"F": 0, "B": 0}
        order = []
        for k in kinds:
            order.append((k, counts[k]))
            counts[k] += 1
        assert order == one_f_one_b(stages, micro)[s], f"stage {s}"

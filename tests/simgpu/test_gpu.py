"""The simulated GPU in virtual time (envpipe.simgpu.gpu.SimGpu): worked numbers, the counter, seeded noise."""

from __future__ import annotations

import numpy as np
import pytest

from envpipe.profile import Profile
from envpipe.simgpu import JobTruth, SimGpu

BLOCKING_W = 70.38  # the A40's blocking power (Perseus)


def knots(gpu: SimGpu) -> list[tuple[float, float]]:
    return list(zip(gpu.trace._t, gpu.trace._j, strict=True))


def test_worked_units_link_tail_and_counter(bloom: Profile) -> None:
    """Stage 0 of 2 runs BLOOM/A40's stage 0. Noise off:
    - a forward of 1 GFLOP at 1740 MHz lasts 10 ms at 293.28 W (the table's top power): 2.9328 J at t = 10 ms;
    - its next input arrives at 50 ms: blocked 40 ms at 70.38 W;
    - at 1005 MHz (1000 asked: the nearest supported) a backward of 2 GFLOP lasts 20 ms x T(1005)/T(1740);
    - a 3 ms tail (optimizer step) follows at the tail power."""
    gpu = SimGpu(JobTruth.embedded(2), stage=0, noise=0.0)
    p_f = bloom.fwd_energy[0, 0] / bloom.fwd_time[0, 0]
    assert p_f == pytest.approx(293.28, abs=0.01)
    assert gpu.needs_flops("F")
    assert gpu.unit_start() == 0.0
    assert gpu.unit_end("F", 1e9) == pytest.approx(0.010)
    e1 = 0.010 * p_f
    assert gpu.energy_j() == pytest.approx(e1) and not gpu.needs_flops("F")

    gpu.data_ready(0.05)
    assert gpu.unit_start() == pytest.approx(0.05)
    assert gpu.energy_at(0.05) == pytest.approx(e1 + 0.04 * BLOCKING_W)
    assert gpu.set_clock(1000) == 1005
    k = bloom.freq_index(1005)
    b_s = 0.020 * bloom.bwd_time[0, k] / bloom.bwd_time[0, 0]
    b_w = bloom.bwd_energy[0, k] / bloom.bwd_time[0, k]
    end_b = gpu.unit_end("B", 2e9)
    assert end_b == pytest.approx(0.05 + b_s)
    tail_w = BLOCKING_W + 0.49 * (b_w - BLOCKING_W)
    end = gpu.tail(0.003)
    assert end == pytest.approx(end_b + 0.003)
    total = e1 + 0.04 * BLOCKING_W + b_s * b_w + 0.003 * tail_w
    assert gpu.energy_j() == pytest.approx(total)
    want = [(0.0, 0.0), (0.01, e1), (0.05, e1 + 0.04 * BLOCKING_W), (end_b, e1 + 0.04 * BLOCKING_W + b_s * b_w),
            (end, total)]
    np.testing.assert_allclose(np.array(knots(gpu)), np.array(want), rtol=1e-12)
    # an iteration's end: every GPU waits for the last one, blocked
    gpu.sync(0.2)
    assert gpu.now() == 0.2 and gpu.energy_j() == pytest.approx(total + (0.2 - end) * BLOCKING_W)
    # a later forward reuses the FLOPs counted for its kind
    gpu.set_clock(1740)
    gpu.unit_start()
    assert gpu.unit_end("F") == pytest.approx(0.21)


def test_idle_reads_the_blocking_power() -> None:
    gpu = SimGpu(JobTruth.embedded(1), stage=0)
    gpu.idle(2.0)
    assert gpu.energy_j() / gpu.now() == pytest.approx(BLOCKING_W)
    assert gpu.trace.between(0.0, 2.0) == pytest.approx(2.0 * BLOCKING_W)


def test_link_carries_the_senders_time() -> None:
    gpu = SimGpu(JobTruth.embedded(2), stage=1, noise=0.0)
    gpu.data_ready(0.004 + gpu.transfer_s(25_000))  # sent at 4 ms: 10 us + 1 us on the link
    assert gpu.unit_start() == pytest.approx(0.004011)


def test_a_straggler_is_slower_by_its_slowdown() -> None:
    job = JobTruth.embedded(2)
    normal, slow = SimGpu(job, 0, noise=0.0), SimGpu(job, 0, noise=0.0, slowdown=1.5)
    for gpu in (normal, slow):
        gpu.unit_start()
        gpu.unit_end("F", 1e9)
        gpu.tail(0.002)
    assert slow.now() == pytest.approx(1.5 * normal.now())


def run(seed: int, stage: int = 1, replica: int = 0, units: int = 40) -> SimGpu:
    gpu = SimGpu(JobTruth.embedded(2), stage=stage, replica=replica, seed=seed)
    for i in range(units):
        gpu.set_clock([1740, 1440, 1005][i % 3])
        gpu.data_ready(0.003 * i)
        gpu.unit_start()
        gpu.unit_end("F" if i % 2 else "B", 1.0e9 + i)
        if i % 10 == 9:
            gpu.tail(0.002)
    return gpu


def test_same_seed_same_counter_to_the_last_digit() -> None:
    a, b = run(seed=11), run(seed=11)
    assert knots(a) == knots(b)
    assert knots(run(seed=12)) != knots(a)  # another seed, other noise
    assert knots(run(seed=11, replica=1)) != knots(a)  # every GPU of the job draws its own


def test_noise_is_about_one_percent_and_bounded() -> None:
    """Time and power of 3000 units at one clock: mean 1, standard deviation 1 %, never beyond 3 %."""
    gpu = SimGpu(JobTruth.embedded(1), stage=0, seed=5)
    quiet = SimGpu(JobTruth.embedded(1), stage=0, noise=0.0)
    quiet.unit_start()
    quiet.unit_end("F", 1e9)
    want_s, want_j = quiet.now(), quiet.energy_j()
    seconds, joules = [], []
    for _ in range(3000):
        t0, e0 = gpu.now(), gpu.energy_j()
        gpu.unit_start()
        gpu.unit_end("F", 1e9)
        seconds.append((gpu.now() - t0) / want_s)
        joules.append((gpu.energy_j() - e0) / want_j)
    power = np.asarray(joules) / np.asarray(seconds)
    for x in (np.asarray(seconds), power):
        assert abs(x.mean() - 1) < 0.001 and 0.009 < x.std() < 0.011
        assert x.min() >= 0.97 - 1e-12 and x.max() <= 1.03 + 1e-12


def test_misuse_is_one_clear_error() -> None:
    gpu = SimGpu(JobTruth.embedded(2), stage=0)
    with pytest.raises(RuntimeError, match="unit_end without unit_start"):
        gpu.unit_end("F", 1e9)
    gpu.unit_start()
    with pytest.raises(RuntimeError, match="already running"):
        gpu.unit_start()
    with pytest.raises(RuntimeError, match="while a unit runs"):
        gpu.tail(0.001)
    with pytest.raises(ValueError, match="no FLOPs counted yet for a B unit"):
        gpu.unit_end("B")
    with pytest.raises(ValueError, match="'F' or 'B'"):
        gpu.unit_end("W", 1.0)
    with pytest.raises(ValueError, match="non-negative number"):
        gpu.unit_end("F", -1.0)
    gpu.unit_end("F", 1e9)  # the unit is still open after refused ends: it ends once
    with pytest.raises(ValueError, match="slowdown must be >= 1"):
        SimGpu(JobTruth.embedded(2), 0, slowdown=0.5)
    with pytest.raises(ValueError, match="not a stage of a 2-stage job"):
        SimGpu(JobTruth.embedded(2), 5)
    with pytest.raises(ValueError, match="non-negative integer"):
        SimGpu(JobTruth.embedded(2), 0, seed=-1)

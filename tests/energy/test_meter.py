"""Energy meters: interpolation at unit boundaries, a polled counter whose values the test controls,
the NVML reader (against benchmarks/clockd_study/fake_pynvml.py, a fake at the pynvml module API) and the sim
counter."""

from __future__ import annotations

import time

import numpy as np
import pytest

from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml
from envpipe.energy.accounting import account
from envpipe.energy.meter import CounterTrace, PolledMeter, SimMeter, nvml_reader
from envpipe.simgpu import JobTruth, SimGpu, unit_s


def test_trace_interpolates_between_knots() -> None:
    tr = CounterTrace()
    for t, j in [(0.0, 0.0), (1.0, 100.0), (2.0, 400.0)]:
        tr.add(t, j)
    assert tr.at(0.5) == pytest.approx(50.0)
    assert list(tr.between(np.array([0.5, 1.5]), np.array([1.5, 2.0]))) == pytest.approx([200.0, 150.0])
    assert tr.at(5.0) == pytest.approx(400.0)  # past the last knot the counter holds
    with pytest.raises(ValueError, match="time order"):
        tr.add(1.5, 500.0)
    with pytest.raises(ValueError, match="no samples"):
        CounterTrace().at(0.0)
    tr.trim(1.5)  # keeps the knot at 1.0 to interpolate from
    assert len(tr) == 2 and tr.at(1.5) == pytest.approx(250.0)


def test_account_splits_an_iteration_into_units_and_idle() -> None:
    tr = CounterTrace()
    for t, j in [(0.0, 0.0), (1.0, 300.0), (2.0, 400.0), (3.0, 700.0)]:  # 300 W, 100 W, 300 W
        tr.add(t, j)
    it = account(tr, [(0.0, 1.0), (2.0, 3.0)], 0.0, 3.0)
    assert it.unit_j == [300.0, 300.0] and it.total_j == 700.0
    assert it.idle_j == pytest.approx(100.0) and it.idle_power_w == pytest.approx(100.0)
    assert it.mean(["F", "B"], "B") == 300.0 and it.mean(["F", "B"], "X") is None
    with pytest.raises(ValueError, match="ends before"):
        account(tr, [], 2.0, 1.0)


class SteppedCounter:
    """A counter the test controls: power as a function of time, published every ``step_s`` (like NVML)."""

    def __init__(self, power_w, step_s: float) -> None:
        self.t0, self.power_w, self.step_s = time.perf_counter(), power_w, step_s
        self.published: dict[int, float] = {}  # step index -> the energy published at its start

    def energy_at(self, t: float) -> float:
        ts = np.linspace(0.0, t, 2001)
        return float(np.trapezoid([self.power_w(x) for x in ts], ts))

    def __call__(self) -> float:
        elapsed = time.perf_counter() - self.t0
        step, since = divmod(elapsed, self.step_s)  # since == elapsed % step_s
        if int(step) not in self.published:  # the value changes only per step: integrate once per step
            self.published[int(step)] = self.energy_at(elapsed - since)  # the last published update
        return self.published[int(step)]


def test_polled_meter_interpolates_a_stepped_counter_at_unit_boundaries() -> None:
    counter = SteppedCounter(lambda t: 100.0 if t < 0.3 else 400.0, step_s=0.02)
    meter = PolledMeter(counter, period_s=0.002)
    try:
        time.sleep(0.6)
        t0 = counter.t0
        low, high = (t0 + 0.05, t0 + 0.25), (t0 + 0.35, t0 + 0.55)
        assert meter.wait_until(high[1])
        it = account(meter.trace, [low, high], t0 + 0.02, t0 + 0.58)
        # each unit lies within one power level: interpolation gives power x duration (one update's smear)
        assert it.unit_j[0] == pytest.approx(100.0 * 0.2, rel=0.25)  # loose: a loaded CPU delays the poller
        assert it.unit_j[1] == pytest.approx(400.0 * 0.2, rel=0.25)
        steps = meter.trace.update_intervals()
        assert np.median(steps) == pytest.approx(0.02, rel=0.5)  # knots are the counter's updates
        assert not meter.wait_until(time.perf_counter() + 10, timeout_s=0.05)  # not covered yet: times out
    finally:
        meter.close()


def test_polled_meter_stops_on_a_failing_counter() -> None:
    calls = []

    def flaky() -> float:
        calls.append(1)
        if len(calls) > 3:
            raise OSError("counter gone")
        return float(len(calls))

    meter = PolledMeter(flaky, period_s=0.001)
    time.sleep(0.05)
    assert meter.error is not None and not meter.wait_until(time.perf_counter() + 1, timeout_s=0.1)
    meter.close()
    with pytest.raises(ZeroDivisionError):
        PolledMeter(lambda: 1 / 0)  # a counter that cannot be read at all fails at once


def test_nvml_reader_reads_the_energy_counter_in_joules() -> None:
    gpu = FakeGpu("GPU-0", energy_mj=5_000_000)
    nvml = FakeNvml([gpu])
    read, shutdown = nvml_reader(0, nvml)
    assert read() == pytest.approx(5070.0)  # the fake advances 70 J per read; mJ -> J
    shutdown()
    assert not nvml.initialized


def test_sim_meter_gives_exact_unit_energy() -> None:
    """A simulated GPU's counter in virtual time: a unit's energy is its power x its simulated time, the rest
    of the iteration blocking power; exact, whatever the machine's load."""
    gpu = SimGpu(JobTruth.embedded(2), 0, noise=0.0)
    gpu.set_clock(gpu.supported_mhz[len(gpu.supported_mhz) // 2])
    gpu.data_ready(0.004)  # the unit's input arrives at 4 ms
    start = gpu.unit_start()
    end = gpu.unit_end("F", 2e9)
    meter = SimMeter(gpu.trace, gpu.energy_at)
    assert meter.wait_until(end + 0.01)  # the iteration ends 10 ms after the unit
    it = account(meter.trace, [(start, end)], 0.0, end + 0.01)
    assert start == pytest.approx(0.004) and end - start > unit_s(2e9)  # below the top clock: slower
    blocking = JobTruth.embedded(2).blocking_w
    assert it.idle_power_w == pytest.approx(blocking) and it.unit_j[0] / (end - start) > blocking

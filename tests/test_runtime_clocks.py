"""Clock setters: the simulated clock's time stretch and energy, the daemon adapter's thread."""

from __future__ import annotations

import threading
import time

import pytest

from envpipe.profile import FrequencyModel
from envpipe.runtime import clocks
from envpipe.runtime.clocks import DaemonClock, SimClock


def test_sim_clock_stretches_units_by_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    model = FrequencyModel.default()
    low = model.clocks_mhz[len(model.clocks_mhz) // 2]
    scale = model.time_scale(low)
    assert scale > 1.05
    clock = SimClock(model)
    clock.set(low)
    sleeps: list[float] = []
    monkeypatch.setattr(clocks.time, "sleep", sleeps.append)  # what it sleeps, exactly, not how long it took
    clock.after_unit(0.05)  # a unit that took 50 ms at the top clock
    assert sleeps == [pytest.approx(0.05 * (scale - 1))]
    assert clock.requested == [low]
    busy = 0.05 * scale * model.busy_power(low)
    assert clock.energy_j() >= busy  # plus idle power for the rest of the elapsed time


def test_sim_clock_energy_counts_idle_time_at_idle_power() -> None:
    model = FrequencyModel.default()
    idle, busy = model.idle_power_w, model.busy_power(model.max_mhz)
    t0 = time.perf_counter()
    clock = SimClock(model)
    time.sleep(0.05)
    t1 = time.perf_counter()
    e = clock.energy_j()
    t2 = time.perf_counter()
    assert 0.05 * idle <= e <= (t2 - t0) * idle  # bounds from the times around, however busy the machine
    clock.after_unit(0.01)  # top clock: no stretch; the unit's 10 ms count busy, not idle
    e2 = clock.energy_j()
    t3 = time.perf_counter()
    assert 0.01 * (busy - idle) <= e2 - e <= 0.01 * busy + (t3 - t1 - 0.01) * idle


class SlowClient:
    """Stands in for envpipe.clock.client.ClockClient at its module API (set/energy_mj/close)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.release = threading.Event()
        self.closed = False

    def set(self, uuid: str, mhz: int) -> None:
        self.release.wait(5)
        self.calls.append((uuid, mhz))

    def energy_mj(self, uuid: str) -> int:
        return 123456

    def close(self) -> None:
        self.closed = True


def test_daemon_clock_never_blocks_the_training_thread() -> None:
    client = SlowClient()
    clock = DaemonClock(client, "GPU-1", [1410, 1005])
    t0 = time.perf_counter()
    for mhz in (1400, 1200, 1000):
        clock.set(mhz)
    assert time.perf_counter() - t0 < 2.0  # the client is stuck for 5 s, the caller is not
    client.release.set()
    deadline = time.monotonic() + 5
    while (not client.calls or client.calls[-1] != ("GPU-1", 1000)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.calls[-1] == ("GPU-1", 1000)  # the latest request wins; stale ones may be skipped
    assert clock.energy_j() == pytest.approx(123.456)
    clock.close()
    assert client.closed


def test_daemon_clock_survives_a_failing_request() -> None:
    class Failing(SlowClient):
        def set(self, uuid: str, mhz: int) -> None:
            raise OSError("socket gone")

    client = Failing()
    clock = DaemonClock(client, "GPU-2", [1410])
    clock.set(900)
    time.sleep(0.05)
    clock.set(800)
    clock.close()
    assert clock.requested == [900, 800]


def test_clock_backend_choice() -> None:
    from types import SimpleNamespace

    import torch

    from envpipe.runtime.config import parse
    from envpipe.runtime.runner import make_clock

    grid = SimpleNamespace(get_data_parallel_id=lambda: 0)  # replica 0
    cpu = SimpleNamespace(device=torch.device("cpu"), grid=grid)
    gpu = SimpleNamespace(device=torch.device("cuda", 0), grid=grid)
    assert isinstance(make_clock(parse({}, {}), cpu), SimClock)
    assert make_clock(parse({"clock": "none"}, {}), cpu) is None
    with pytest.raises(ValueError, match="'daemon' needs a GPU"):
        make_clock(parse({"clock": "daemon"}, {}), cpu)
    with pytest.raises(ValueError, match="'sim' emulates clocks on CPU only"):
        make_clock(parse({"clock": "sim"}, {}), gpu)

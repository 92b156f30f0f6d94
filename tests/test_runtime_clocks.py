"""Clock setters: the simulated clock's time stretch and energy; the daemon clock against a real envpipe-clockd;
which clock a rank gets (decided before the model is built)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from envpipe.clock.service import ServiceConfig
from envpipe.profile import FrequencyModel
from envpipe.runtime import clocks
from envpipe.runtime.clocks import ClockUnavailable, DaemonClock, Device, NvmlEnergyClock, SimClock, make_clock
from envpipe.runtime.config import parse
from tests.clockd_helpers import daemon_thread


def test_sim_clock_stretches_units_by_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    model = FrequencyModel.default()
    low = model.clocks_mhz[len(model.clocks_mhz) // 2]
    scale = model.time_scale(low)
    assert scale > 1.05
    clock = SimClock(model)
    clock.set(low)
    sleeps: list[float] = []
    monkeypatch.setattr(clocks.time, "sleep", sleeps.append)  # what it sleeps, exactly, not how long it took
    clock.after_unit("F", 0.05, 0.05)  # a unit that took 50 ms (wall and CPU) at the top clock
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
    clock.after_unit("F", 0.01, 0.01)  # top clock: no stretch; the unit's 10 ms count busy, not idle
    e2 = clock.energy_j()
    t3 = time.perf_counter()
    assert 0.01 * (busy - idle) <= e2 - e <= 0.01 * busy + (t3 - t1 - 0.01) * idle



def test_sim_clock_stretches_cpu_time_not_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit slowed by other load (wall 80 ms, CPU 50 ms) gets the simulated GPU time of its 50 ms of work."""
    model = FrequencyModel.default()
    low = model.clocks_mhz[len(model.clocks_mhz) // 2]
    scale = model.time_scale(low)
    clock = SimClock(model)
    clock.set(low)
    sleeps: list[float] = []
    monkeypatch.setattr(clocks.time, "sleep", sleeps.append)
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 1)
    clock.after_unit("F", 0.08, 0.05)
    assert sleeps == [pytest.approx(max(0.0, 0.05 * scale - 0.08))] or (0.05 * scale <= 0.08 and sleeps == [])
    assert clock._busy_s == pytest.approx(0.05 * scale)  # busy energy follows the work, not the load
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 4)  # intra-op threads: wall time stands in
    clock.after_unit("F", 0.08, 0.05)
    assert clock._busy_s == pytest.approx(0.05 * scale + 0.08 * scale)


CPU = Device(on_gpu=False, local_rank=0)
GPU = Device(on_gpu=True, local_rank=0)


def test_clock_choice_without_a_daemon(tmp_path: Path) -> None:
    env = {"ENVPIPE_CLOCKD_SOCKET": str(tmp_path / "none.sock")}
    assert isinstance(make_clock(parse({}, {}), CPU, environ=env), SimClock)
    assert make_clock(parse({"clock": "none", "type": "baseline"}, {}), CPU, environ=env) is None
    with pytest.raises(ClockUnavailable, match=r"asked for .*'daemon'.* no envpipe-clockd socket at .*none\.sock"):
        make_clock(parse({"clock": "daemon"}, {}), CPU, environ=env)
    with pytest.raises(ClockUnavailable, match="'sim' emulates clocks on CPU only"):
        make_clock(parse({"clock": "sim"}, {}), GPU, environ=env)


def test_environment_chooses_the_clock() -> None:
    assert parse({}, {"ENVPIPE_CLOCK": "daemon"}).clock == "daemon"
    assert parse({"clock": "sim", "type": "baseline"}, {"ENVPIPE_CLOCK": "none"}).clock == "none"


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch):
    from tests.fake_pynvml import FakeGpu, FakeNvml

    gpus = [FakeGpu(uuid="GPU-aaaa")]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))  # what `import pynvml` in the runtime gets
    return gpus


def test_gpu_without_the_daemon_runs_at_default_clocks_with_a_note(
    tmp_path: Path, fake_nvml: list, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"ENVPIPE_CLOCKD_SOCKET": str(tmp_path / "absent.sock")}
    clock = make_clock(parse({}, {}), GPU, environ=env)
    assert isinstance(clock, NvmlEnergyClock) and not clock.controls_clocks
    assert clock.note is not None and "clocks cannot be changed here" in clock.note
    assert clock.energy_label == "measured" and clock.supported_mhz[0] == 1980
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [f"envpipe: {clock.note}"]
    clock.close()
    with pytest.raises(ClockUnavailable, match="asked for"):
        make_clock(parse({"clock": "daemon"}, {}), GPU, environ=env)


def test_daemon_clock_on_cpu_locks_through_clockd_and_reports_refusals(tmp_path: Path) -> None:
    """A real envpipe-clockd (sim backend, allow-list up to 1200 MHz): locks arrive; a refusal reaches the clock."""
    sock = str(tmp_path / "clockd.sock")
    with daemon_thread(sock, config=ServiceConfig(max_mhz=1200)) as service:
        env = {"ENVPIPE_CLOCKD_SOCKET": sock}
        clock = make_clock(parse({"clock": "daemon"}, {}), Device(False, local_rank=1), environ=env)
        assert isinstance(clock, DaemonClock) and clock.emulated is not None
        second = service.gpu_uuids()[1]
        assert clock.gpu_uuid == second  # the daemon's GPU number LOCAL_RANK
        assert clock.energy_label == "simulated" and clock.needs_unit_times
        t0 = time.perf_counter()
        clock.set(1005)
        assert time.perf_counter() - t0 < 0.5  # queued on the client's loop thread, never awaited here
        clock._client.flush()
        assert service.locked()[second] == 1005
        clock.set(1410)  # above the allow-list: refused with 422
        clock._client.flush()
        refused = clock.refusals()
        assert [(r.mhz, r.status) for r in refused] == [(1410, 422)] and "1410" in refused[0].message
        clock.close()
        assert second not in service.locked()  # the lease ended: the daemon reset the GPU


def test_daemon_clock_by_uuid_and_an_unknown_uuid(tmp_path: Path) -> None:
    sock = str(tmp_path / "clockd.sock")
    with daemon_thread(sock) as service:
        first = service.gpu_uuids()[0]
        env = {"ENVPIPE_CLOCKD_SOCKET": sock, "ENVPIPE_GPU_UUID": first}
        clock = make_clock(parse({"clock": "daemon"}, {}), Device(False, local_rank=3), environ=env)
        assert isinstance(clock, DaemonClock) and clock.gpu_uuid == first
        clock.close()
        env["ENVPIPE_GPU_UUID"] = "GPU-nope"
        with pytest.raises(ClockUnavailable, match="no GPU GPU-nope"):
            make_clock(parse({"clock": "daemon"}, {}), CPU, environ=env)
        with pytest.raises(ClockUnavailable, match="none for local rank 9"):
            make_clock(parse({"clock": "daemon"}, {}), Device(False, 9), environ={"ENVPIPE_CLOCKD_SOCKET": sock})


def test_sim_clock_fixes_unit_costs_after_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """After `fix_unit_costs` a unit's simulated time is the calibration's median work per kind, whatever the
    unit's own CPU time (a neighbour's load) says; before it, the unit's own work counts."""
    model = FrequencyModel.default()
    low = model.clocks_mhz[-1]
    clock = SimClock(model, dilation=4.0)
    monkeypatch.setattr(clocks.time, "sleep", lambda s: None)
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 1)
    for cpu in (0.010, 0.012, 0.011):
        clock.after_unit("F", 0.001, cpu)
    clock.after_unit("B", 0.001, 0.030)
    assert clock._busy_s == pytest.approx(4.0 * (0.010 + 0.012 + 0.011 + 0.030))
    clock.fix_unit_costs()
    assert clock.unit_work_s == {"F": pytest.approx(0.011), "B": pytest.approx(0.030)}
    clock.set(low)
    before = clock._busy_s
    clock.after_unit("F", 0.001, 0.500)  # a unit slowed by load: its CPU time no longer matters
    assert clock._busy_s - before == pytest.approx(4.0 * 0.011 * model.time_scale(low))

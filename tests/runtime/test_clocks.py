"""Clock setters: the simulated GPU's virtual time and energy; the daemon clock against a real envpipe-clockd;
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
from tests.support.clockd_helpers import daemon_thread


def test_sim_clock_advances_virtual_time_by_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit lasts its CPU work x the model's slowdown at the clock, in virtual time; energy is exact."""
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 1)
    model = FrequencyModel.default()
    low = model.clocks_mhz[len(model.clocks_mhz) // 2]
    scale = model.time_scale(low)
    assert scale > 1.05
    clock = SimClock(model)
    clock.set(low)
    assert clock.unit_start() == 0.0
    end = clock.after_unit("F", 0.9, 0.05)  # 50 ms of work; the wall time (0.9 s of load) does not count
    assert end == pytest.approx(0.05 * scale) and clock.now() == end and clock.requested == [low]
    busy = 0.05 * scale * model.busy_power(low)
    assert clock.energy_j() == pytest.approx(busy)
    clock.sync(1.0)  # the iteration ends at 1.0 s on the slowest rank: idle (blocking power) until then
    assert clock.energy_j() == pytest.approx(busy + (1.0 - end) * model.idle_power_w)


def test_sim_clock_waits_for_its_input_in_virtual_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 1)
    model = FrequencyModel.default()
    clock = SimClock(model)
    clock.data_ready(0.3)  # the neighbour sent this unit's input at 0.3 s
    assert clock.unit_start() == 0.3
    assert clock.after_unit("B", 0.01, 0.02) == pytest.approx(0.32)
    assert float(clock.trace.between(0.0, 0.3)) == pytest.approx(0.3 * model.idle_power_w)  # waiting: blocking power
    clock.data_ready(0.1)  # an older timestamp never moves time back
    assert clock.unit_start() == pytest.approx(0.32)


def test_sim_clock_intra_op_threads_use_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """With several intra-op threads the training thread's CPU time misses their work: wall time stands in."""
    clock = SimClock()
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 4)
    clock.unit_start()
    assert clock.after_unit("F", 0.08, 0.05) == pytest.approx(0.08)


def test_straggler_slowdown_stretches_virtual_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 1)
    clock = SimClock(slowdown=3.0)
    clock.unit_start()
    assert clock.after_unit("F", 0.01, 0.01) == pytest.approx(0.03)
    with pytest.raises(ValueError, match="slowdown must be >= 1"):
        SimClock(slowdown=0.5)


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
    from tests.support.fake_pynvml import FakeGpu, FakeNvml

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
    """After `fix_unit_costs` a unit lasts its kind's median FLOPs at the job's rate, whatever its CPU time (a
    neighbour's load) says; before it, the unit's own CPU work counts; without FLOPs, the median CPU work."""
    model = FrequencyModel.default()
    low = model.clocks_mhz[-1]
    monkeypatch.setattr(clocks.torch, "get_num_threads", lambda: 1)
    clock = SimClock(model)
    for kind, cpu, flops in (("F", 0.010, 2e9), ("F", 0.012, 2e9), ("F", 0.011, 2e9), ("B", 0.030, 4e9)):
        clock.unit_start()
        clock.after_unit(kind, 0.001, cpu, flops)
    assert clock.counting and clock.now() == pytest.approx(0.010 + 0.012 + 0.011 + 0.030)
    assert clock.calibration_work() == (pytest.approx(0.063), pytest.approx(10e9))
    clock.fix_unit_costs(1e11)  # 100 GFLOP/s, the job's rate
    assert not clock.counting and clock.unit_work_s == {"F": pytest.approx(0.02), "B": pytest.approx(0.04)}
    clock.set(low)
    before = clock.now()
    clock.unit_start()
    clock.after_unit("F", 0.001, 0.500)  # a unit slowed by load: its CPU time no longer matters
    assert clock.now() - before == pytest.approx(0.02 * model.time_scale(low))
    no_flops = SimClock(model)
    for kind, cpu in (("F", 0.010), ("F", 0.014), ("B", 0.030)):
        no_flops.unit_start()
        no_flops.after_unit(kind, 0.001, cpu)
    no_flops.fix_unit_costs(0.0)
    assert no_flops.unit_work_s == {"F": pytest.approx(0.012), "B": pytest.approx(0.030)}

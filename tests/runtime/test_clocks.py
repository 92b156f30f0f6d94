"""Clock setters: the simulated GPU's virtual time and energy; the daemon clock against a real envpipe-clockd;
which clock a rank gets (decided before the model is built)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from envpipe.clock.service import ServiceConfig
from envpipe.runtime.clocks import (
    ClockUnavailable,
    DaemonClock,
    Device,
    NvmlEnergyClock,
    SimClock,
    make_clock,
    sim_clock,
)
from envpipe.runtime.config import parse
from tests.support.clockd_helpers import daemon_thread
from tests.support.scheduling import bound_s


def test_sim_clock_locks_its_simulated_gpu_and_resets_on_close() -> None:
    """The sim clock is the clock of a simulated GPU (envpipe.simgpu): a request snaps to its nearest clock, as a
    driver does; closing goes back to the top clock. The GPU's time and energy are the engine's business."""
    clock = sim_clock(Device(False, 0, replica=0, stage=1, stages=2))
    gpu = clock.gpu
    assert clock.supported_mhz == gpu.supported_mhz and clock.controls_clocks and clock.needs_unit_times
    clock.set(1003)
    assert gpu.mhz == min(gpu.supported_mhz, key=lambda f: abs(f - 1003))
    clock.close()
    assert gpu.mhz == gpu.max_mhz and clock.energy_j() == gpu.energy_j() == 0.0


def test_sim_clock_per_stage_and_straggler() -> None:
    """Each rank's simulated GPU runs its own stage's share of the job's truth; a slowdown makes a straggler."""
    slow = sim_clock(Device(False, 0, replica=1, stage=0, stages=2), slowdown=3.0).gpu
    fast = sim_clock(Device(False, 0, replica=0, stage=0, stages=2)).gpu
    assert (slow.stage, slow.replica, slow.slowdown) == (0, 1, 3.0)
    for gpu in (slow, fast):
        gpu.unit_start()
        gpu.unit_end("F", 1e9)
    assert slow.now() == pytest.approx(3 * fast.now(), rel=0.1)  # noise: 1 % per unit
    with pytest.raises(ValueError, match="slowdown must be >= 1"):
        sim_clock(Device(False, 0), slowdown=0.5)


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
    from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml

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
        assert time.perf_counter() - t0 < bound_s(0.5)  # queued on the client's loop thread, never awaited here
        clock._client.flush()
        assert service.locked()[second] == 1005
        clock.set(1410)  # above the allow-list: refused with 422
        clock._client.flush()
        refused = clock.refusals(0)
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


def test_a_cuda_device_is_metered_by_its_uuid_not_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA_VISIBLE_DEVICES=2,3 a process's cuda:0 is the host's third GPU, and NVML numbers every GPU of the
    host: the meter finds its GPU by UUID. (Two 2-GPU jobs side by side on 4 x H200, 2026-11-28: by index, the
    second job read the first job's GPUs.)"""
    import types
    import uuid

    import torch

    from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml
    from envpipe.energy.meter import nvml_id, nvml_reader

    ids = [uuid.UUID(int=i + 1) for i in range(4)]
    nvml = FakeNvml([FakeGpu(f"GPU-{u}", energy_mj=10**9 * (i + 1)) for i, u in enumerate(ids)])
    visible = [ids[2], ids[3]]  # CUDA_VISIBLE_DEVICES=2,3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=visible[i]))
    assert nvml_id(0) == f"GPU-{ids[2]}"
    read, close = nvml_reader(nvml_id(1), nvml)
    assert round(read() / 1e6) == 4  # the host's fourth GPU (4 MJ)
    close()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvml_id(1) == 1  # no CUDA (a fake NVML on CPU): the index

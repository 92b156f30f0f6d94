"""Backends: nvml against a faithful fake pynvml, readonly never writes, sim integrates energy."""

from __future__ import annotations

import pynvml
import pytest

from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml
from envpipe.clock.backends import NvmlBackend, ReadonlyBackend, SimBackend, make_backend
from envpipe.clock.errors import BackendFailure, ClockError, NoPermission, NotSupported, UnknownGpu

A, B = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"


def test_fake_errors_are_real_pynvml_errors() -> None:
    from benchmarks.clockd_study import fake_pynvml

    exc = fake_pynvml.NVMLError_NoPermission()
    assert isinstance(exc, pynvml.NVMLError_NoPermission) and exc.value == pynvml.NVML_ERROR_NO_PERMISSION


def test_nvml_lists_by_uuid_with_supported_clocks_at_top_memory_clock() -> None:
    fake = FakeNvml([FakeGpu(A), FakeGpu(B, name="NVIDIA A100")])
    be = NvmlBackend(fake)
    gpus = {g.uuid: g for g in be.gpus()}
    assert set(gpus) == {A, B} and gpus[B].name == "NVIDIA A100"
    assert gpus[A].supported_mhz[0] == 1980 and len(gpus[A].supported_mhz) > 10
    assert be.current_mhz(A) == 1980
    assert be.energy_mj(A) - be.energy_mj(A) == -70_000


def test_nvml_lock_and_reset_call_nvml_with_min_equal_max() -> None:
    gpu = FakeGpu(A)
    be = NvmlBackend(FakeNvml([gpu]))
    be.lock(A, 1200)
    assert gpu.calls == [("lock", 1200, 1200)] and be.current_mhz(A) == 1200
    be.reset(A)
    assert gpu.calls[-1] == ("reset",) and be.current_mhz(A) == 1980


def test_nvml_errors_become_clear_answers() -> None:
    gpu = FakeGpu(A, writable=False, has_energy=False)
    be = NvmlBackend(FakeNvml([gpu]))
    with pytest.raises(NoPermission, match="CAP_SYS_ADMIN") as exc:
        be.lock(A, 1200)
    assert exc.value.status == 403
    assert be.energy_mj(A) is None  # NotSupported energy counter is "no counter", not an error
    gpu.writable = True
    with pytest.raises(BackendFailure, match="nvmlDeviceSetGpuLockedClocks"):
        be.lock(A, 1201)  # the driver's InvalidArgument
    with pytest.raises(UnknownGpu):
        be.lock(B, 1200)


def test_nvml_not_supported_maps_to_501() -> None:
    class NoClocks(FakeNvml):
        def nvmlDeviceSetGpuLockedClocks(self, h, lo, hi):
            raise self.NVMLError_NotSupported()

    be = NvmlBackend(NoClocks([FakeGpu(A)]))
    with pytest.raises(NotSupported) as exc:
        be.lock(A, 1200)
    assert exc.value.status == 501


def test_readonly_reads_for_real_and_records_writes_without_calling_nvml() -> None:
    gpu = FakeGpu(A, sm_mhz=1500)
    be = ReadonlyBackend(FakeNvml([gpu]))
    be.lock(A, 1200)
    be.reset(A)
    assert gpu.calls == [] and be.current_mhz(A) == 1500
    assert be.recorded == [("lock", A, 1200), ("reset", A, None)]
    with pytest.raises(BackendFailure):
        be.lock(A, 1201)


def test_sim_energy_integrates_idle_then_busy_power() -> None:
    now = [0.0]
    be = SimBackend(1, clock=lambda: now[0])
    (g,) = be.gpus()
    model = be.model
    now[0] = 10.0
    assert be.energy_mj(g.uuid) == int(model.idle_power_w * 10 * 1000)
    low = model.clocks_mhz[-1]
    be.lock(g.uuid, low)
    now[0] = 20.0
    expected = model.idle_power_w * 10 + model.busy_power(low) * 10
    assert be.energy_mj(g.uuid) == pytest.approx(expected * 1000, abs=1)
    assert be.current_mhz(g.uuid) == low
    be.reset(g.uuid)
    assert be.current_mhz(g.uuid) == model.max_mhz


def test_make_backend_rejects_unknown_names() -> None:
    with pytest.raises(ClockError, match="unknown backend"):
        make_backend("cuda")

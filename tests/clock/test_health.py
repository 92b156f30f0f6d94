"""GPU health alone: a fault starts reset retries that back off until a reset succeeds (no waiting: the
pauses are zero), a driver call past its deadline is a fault, and a stopped daemon retries nothing."""

from __future__ import annotations

import asyncio

import pytest

from envpipe.clock.backends import GpuStatic
from envpipe.clock.errors import BackendFailure, GpuTimeout, GpuUnhealthy, UnknownGpu
from envpipe.clock.gpus import ManagedGpu
from envpipe.clock.health import GpuHealth


class FlakyBackend:
    """One GPU whose next ``failures`` resets fail."""

    name, applies_writes, blocking = "flaky", True, False

    def __init__(self, failures: int) -> None:
        self.failures, self.resets = failures, 0

    def gpus(self) -> list[GpuStatic]:
        return [GpuStatic("GPU-a", "fake", (1410, 900), 0)]

    def reset(self, uuid: str) -> None:
        self.resets += 1
        if self.failures:
            self.failures -= 1
            raise BackendFailure("the driver said no")


class Seen:
    def __init__(self) -> None:
        self.faulted: list[str] = []
        self.recovered: list[str] = []

    def on_fault(self, gpu: ManagedGpu) -> None:
        self.faulted.append(gpu.uuid)

    async def on_recovered(self, gpu: ManagedGpu) -> None:
        self.recovered.append(gpu.uuid)


def make(failures: int) -> tuple[GpuHealth, FlakyBackend, Seen]:
    backend, seen = FlakyBackend(failures), Seen()
    return GpuHealth(backend, 1.0, (0.0, 0.0), seen.on_fault, seen.on_recovered), backend, seen


def test_a_fault_is_retried_until_a_reset_succeeds() -> None:
    health, backend, seen = make(failures=2)

    async def fault_and_wait() -> None:
        gpu = health.gpu("GPU-a")
        gpu.locked_mhz = 900
        health.fault(gpu, "reset failed")
        health.fault(gpu, "again")  # one retry loop per GPU
        assert gpu.locked_mhz is None and health.faults() == {"GPU-a": "again"}
        with pytest.raises(GpuUnhealthy):
            health.healthy("GPU-a")
        while health.faults():
            await asyncio.sleep(0)

    asyncio.run(fault_and_wait())
    assert backend.resets == 3 and seen.faulted == ["GPU-a", "GPU-a"] and seen.recovered == ["GPU-a"]
    assert health.healthy("GPU-a").fault is None
    with pytest.raises(UnknownGpu):
        health.gpu("GPU-b")


def test_a_call_past_its_deadline_is_a_fault() -> None:
    health, _, seen = make(failures=0)

    def stuck() -> None:
        raise GpuTimeout("stuck did not return within 1 s")

    async def call() -> None:
        with pytest.raises(GpuTimeout):
            await health.call(health.gpu("GPU-a"), stuck)
        await health.stop()

    asyncio.run(call())
    gpu = health.gpu("GPU-a")
    assert gpu.timeouts == 1 and gpu.fault == "stuck did not return within 1 s" and seen.faulted == ["GPU-a"]


def test_a_stopped_health_starts_no_retry() -> None:
    health, backend, _ = make(failures=0)

    async def stop_then_fault() -> None:
        await health.stop()
        health.fault(health.gpu("GPU-a"), "reset failed")
        await asyncio.sleep(0)

    asyncio.run(stop_then_fault())
    assert backend.resets == 0 and health.faults() == {"GPU-a": "reset failed"}

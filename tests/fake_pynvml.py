"""A faithful fake of the pynvml module for the nvml backend: same function names, units (MHz, mJ),
constants and exception classes (subclasses of the real pynvml.NVMLError classes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
NVMLError = pynvml.NVMLError


class NVMLError_NoPermission(pynvml.NVMLError_NoPermission):
    pass


class NVMLError_NotSupported(pynvml.NVMLError_NotSupported):
    pass


class NVMLError_InvalidArgument(pynvml.NVMLError_InvalidArgument):
    pass


class NVMLError_Uninitialized(pynvml.NVMLError_Uninitialized):
    pass


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    mem_clocks: tuple[int, ...] = (3201, 1593)
    graphics: tuple[int, ...] = tuple(range(1980, 344, -15))
    sm_mhz: int = 1980
    energy_mj: int = 1_000_000
    has_energy: bool = True
    writable: bool = True
    calls: list[tuple] = field(default_factory=list)


class FakeNvml:
    """Installed as the ``nvml`` module of NvmlBackend. Attribute names mirror pynvml."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVMLError = NVMLError
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.refs = 0  # NVML counts nvmlInit calls; each nvmlShutdown undoes one

    @property
    def initialized(self) -> bool:
        return self.refs > 0

    def _check(self) -> None:
        if not self.initialized:
            raise NVMLError_Uninitialized()

    def nvmlInit(self) -> None:
        self.refs += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.refs -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._check()
        if not 0 <= i < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetSupportedMemoryClocks(self, h: FakeGpu) -> list[int]:
        return list(h.mem_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, h: FakeGpu, mem_mhz: int) -> list[int]:
        if mem_mhz not in h.mem_clocks:
            raise NVMLError_InvalidArgument()
        return list(h.graphics) if mem_mhz == max(h.mem_clocks) else list(h.graphics[-10:])

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock_type: int) -> int:
        if clock_type != NVML_CLOCK_SM:
            raise NVMLError_InvalidArgument()
        return h.sm_mhz

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        if not h.has_energy:
            raise NVMLError_NotSupported()
        h.energy_mj += 70_000  # 70 J between two reads
        return h.energy_mj

    def nvmlDeviceSetGpuLockedClocks(self, h: FakeGpu, min_mhz: int, max_mhz: int) -> None:
        self._check()
        h.calls.append(("lock", min_mhz, max_mhz))
        if not h.writable:
            raise NVMLError_NoPermission()
        if min_mhz > max_mhz or min_mhz not in h.graphics:
            raise NVMLError_InvalidArgument()
        h.sm_mhz = max_mhz

    def nvmlDeviceResetGpuLockedClocks(self, h: FakeGpu) -> None:
        self._check()
        h.calls.append(("reset",))
        if not h.writable:
            raise NVMLError_NoPermission()
        h.sm_mhz = max(h.graphics)

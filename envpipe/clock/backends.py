"""Clock backends behind one interface: ``sim`` (simulated GPUs), ``nvml`` (real), ``readonly``.

A backend knows GPUs by UUID and does exactly what it is told; the allow-list, snapping, leases and
ownership live in the daemon. Backend calls for one GPU are made from that GPU's serial worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from envpipe.clock.errors import BackendFailure, ClockError, NoPermission, NotSupported, UnknownGpu

if TYPE_CHECKING:
    from envpipe.profile import FrequencyModel


@dataclass(frozen=True)
class GpuStatic:
    uuid: str
    name: str
    supported_mhz: tuple[int, ...]  # descending
    index: int  # NVML's index on the node (nvidia-smi's and dcgm-exporter's `gpu` label); pods number GPUs apart


class Backend(Protocol):
    name: str
    applies_writes: bool  # False for readonly: lock/reset are checked and recorded, not applied
    blocking: bool  # calls may block (driver): run them on the GPU's worker thread, off the event loop

    def gpus(self) -> list[GpuStatic]: ...
    def current_mhz(self, uuid: str) -> int: ...
    def energy_mj(self, uuid: str) -> int | None: ...
    def lock(self, uuid: str, mhz: int) -> None: ...
    def reset(self, uuid: str) -> None: ...
    def close(self) -> None: ...


@dataclass
class _SimGpu:
    static: GpuStatic
    locked_mhz: int | None = None
    energy_j: float = 0.0
    last_t: float = field(default_factory=time.monotonic)


class SimBackend:
    """Simulated GPUs on the embedded frequency model.

    The energy counter integrates power over time: busy power at the locked clock while a lock is
    held (a job is driving the GPU), idle (blocking) power otherwise.
    """

    applies_writes = True
    blocking = False  # microseconds of arithmetic: cheaper inline than a thread hop

    def __init__(
        self, count: int = 4, model: FrequencyModel | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if model is None:  # numpy and the profile load only for simulated GPUs, not on a GPU node
            from envpipe.profile import FrequencyModel

            model = FrequencyModel.default()
        self.model = model
        self.name = "sim"
        self._now = clock
        self._lock = threading.Lock()
        self._gpus: dict[str, _SimGpu] = {}
        for i in range(count):
            digest = hashlib.sha1(f"envpipe-sim-{i}".encode()).hexdigest()
            uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
            static = GpuStatic(uuid, f"Simulated {self.model.name}", self.model.clocks_mhz, i)
            self._gpus[uuid] = _SimGpu(static, last_t=self._now())

    def _gpu(self, uuid: str) -> _SimGpu:
        try:
            return self._gpus[uuid]
        except KeyError:
            raise UnknownGpu(f"no GPU with UUID {uuid!r}") from None

    def _advance(self, gpu: _SimGpu) -> None:
        now = self._now()
        power = self.model.idle_power_w if gpu.locked_mhz is None else self.model.busy_power(gpu.locked_mhz)
        gpu.energy_j += power * (now - gpu.last_t)
        gpu.last_t = now

    def gpus(self) -> list[GpuStatic]:
        return [g.static for g in self._gpus.values()]

    def current_mhz(self, uuid: str) -> int:
        gpu = self._gpu(uuid)
        return gpu.locked_mhz if gpu.locked_mhz is not None else self.model.max_mhz

    def energy_mj(self, uuid: str) -> int:
        gpu = self._gpu(uuid)
        with self._lock:
            self._advance(gpu)
            return int(gpu.energy_j * 1000)

    def lock(self, uuid: str, mhz: int) -> None:
        gpu = self._gpu(uuid)
        if mhz not in gpu.static.supported_mhz:  # what NVML would say to an unsupported clock
            raise BackendFailure(f"{mhz} MHz is not a supported clock of {uuid}")
        with self._lock:
            self._advance(gpu)
            gpu.locked_mhz = mhz

    def reset(self, uuid: str) -> None:
        gpu = self._gpu(uuid)
        with self._lock:
            self._advance(gpu)
            gpu.locked_mhz = None

    def close(self) -> None:
        return None


class NvmlBackend:
    """Real GPUs through NVML (nvidia-ml-py). ``nvml`` may be injected (a faithful fake in tests)."""

    applies_writes = True
    blocking = True

    def __init__(self, nvml: Any = None) -> None:
        # pynvml is imported here so that the sim backend runs without it
        self.nvml: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        nvml = self.nvml
        self.name = "nvml"
        self._call(nvml.nvmlInit)
        self._handles: dict[str, Any] = {}
        self._static: list[GpuStatic] = []
        for i in range(self._call(nvml.nvmlDeviceGetCount)):
            handle = self._call(nvml.nvmlDeviceGetHandleByIndex, i)
            uuid = _text(self._call(nvml.nvmlDeviceGetUUID, handle))
            name = _text(self._call(nvml.nvmlDeviceGetName, handle))
            self._handles[uuid] = handle
            self._static.append(GpuStatic(uuid, name, self._supported(handle), i))

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; its errors become the daemon's answers (one mapping for every call)."""
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError_NoPermission as exc:
            raise NoPermission(
                f"NVML {fn.__name__}: no permission ({exc}); the daemon needs CAP_SYS_ADMIN or root to change clocks"
            ) from exc
        except nvml.NVMLError_NotSupported as exc:
            raise NotSupported(f"NVML {fn.__name__}: not supported on this GPU ({exc})") from exc
        except nvml.NVMLError as exc:
            raise BackendFailure(f"NVML {fn.__name__} failed: {exc}") from exc

    def _supported(self, handle: Any) -> tuple[int, ...]:
        # Graphics clocks depend on the memory clock; the top memory clock is the one training uses.
        mem = max(self._call(self.nvml.nvmlDeviceGetSupportedMemoryClocks, handle))
        clocks = self._call(self.nvml.nvmlDeviceGetSupportedGraphicsClocks, handle, mem)
        return tuple(sorted({int(c) for c in clocks}, reverse=True))

    def _handle(self, uuid: str) -> Any:
        try:
            return self._handles[uuid]
        except KeyError:
            raise UnknownGpu(f"no GPU with UUID {uuid!r}") from None

    def gpus(self) -> list[GpuStatic]:
        return list(self._static)

    def current_mhz(self, uuid: str) -> int:
        return int(self._call(self.nvml.nvmlDeviceGetClockInfo, self._handle(uuid), self.nvml.NVML_CLOCK_SM))

    def energy_mj(self, uuid: str) -> int | None:
        try:
            return int(self._call(self.nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle(uuid)))
        except NotSupported:
            return None  # pre-Volta GPUs have no energy counter

    def lock(self, uuid: str, mhz: int) -> None:
        self._call(self.nvml.nvmlDeviceSetGpuLockedClocks, self._handle(uuid), mhz, mhz)

    def reset(self, uuid: str) -> None:
        self._call(self.nvml.nvmlDeviceResetGpuLockedClocks, self._handle(uuid))

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):  # shutting down anyway
            self.nvml.nvmlShutdown()


class ReadonlyBackend(NvmlBackend):
    """Real NVML reads; lock/reset are checked (GPU exists, clock supported) and recorded, not applied.

    For trying the daemon on a machine where clocks must not change (a shared or lent GPU).
    """

    applies_writes = False

    def __init__(self, nvml: Any = None) -> None:
        super().__init__(nvml)
        self.name = "readonly"
        self.recorded: list[tuple[str, str, int | None]] = []  # (action, uuid, mhz)

    def lock(self, uuid: str, mhz: int) -> None:
        self._handle(uuid)
        static = next(g for g in self._static if g.uuid == uuid)
        if mhz not in static.supported_mhz:
            raise BackendFailure(f"{mhz} MHz is not a supported clock of {uuid}")
        self.recorded.append(("lock", uuid, mhz))

    def reset(self, uuid: str) -> None:
        self._handle(uuid)
        self.recorded.append(("reset", uuid, None))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def make_backend(name: str, sim_gpus: int = 4) -> Backend:
    if name == "sim":
        return SimBackend(sim_gpus)
    if name == "nvml":
        return NvmlBackend()
    if name == "readonly":
        return ReadonlyBackend()
    raise ClockError(f"unknown backend {name!r} (choose sim, nvml or readonly)")

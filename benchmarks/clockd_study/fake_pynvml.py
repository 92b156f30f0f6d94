"""A faithful fake of the pynvml module for the nvml backend: same function names, units (MHz, mJ),
constants and exception classes (subclasses of the real pynvml.NVMLError classes).

Faults, for the daemon's fault tests:
- ``FakeGpu.hang``: NVML function name -> seconds that call blocks before it runs (a stuck driver
  call). Hangs end early when ``FakeNvml.release`` is set, so a test never leaves a thread asleep.
- ``FakeGpu.fail``: NVML function names that raise NVMLError_Unknown (a driver that refuses).
- ``store``: the GPUs' state lives in a JSON file, read and written under a lock on every call, so it
  outlives a daemon process (SIGKILL it and start another: the clocks are where the dead one left
  them, like a real GPU). ``install(store)`` makes the fake the ``pynvml`` module of a daemon process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sys
import threading
from collections.abc import Iterator
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


class NVMLError_Unknown(pynvml.NVMLError_Unknown):
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
    hang: dict[str, float] = field(default_factory=dict)
    fail: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict) -> FakeGpu:
        d = {**d, "mem_clocks": tuple(d["mem_clocks"]), "graphics": tuple(d["graphics"])}
        return cls(**{**d, "calls": [tuple(c) for c in d["calls"]]})


class FakeNvml:
    """Installed as the ``nvml`` module of NvmlBackend. Attribute names mirror pynvml."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVMLError = NVMLError
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, gpus: list[FakeGpu], store: str | None = None) -> None:
        self.gpus = gpus
        self.store = store
        self.refs = 0  # NVML counts nvmlInit calls; each nvmlShutdown undoes one
        self.release = threading.Event()
        if store is not None and not os.path.exists(store):
            self._save()

    @property
    def initialized(self) -> bool:
        return self.refs > 0

    @classmethod
    def from_store(cls, store: str) -> FakeNvml:
        with open(store) as f:
            return cls([FakeGpu.from_json(g) for g in json.load(f)], store)

    # ---- the store: the "hardware" state shared by every process that uses it ------------------
    def _save(self) -> None:
        assert self.store is not None
        tmp = f"{self.store}.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w") as f:
            json.dump([dataclasses.asdict(g) for g in self.gpus], f)
        os.replace(tmp, self.store)

    @contextlib.contextmanager
    def _synced(self) -> Iterator[None]:
        """Load the store, let the call change it, write it back; one process at a time."""
        if self.store is None:
            yield
            return
        with open(self.store + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with open(self.store) as f:
                fresh = {g["uuid"]: FakeGpu.from_json(g) for g in json.load(f)}
            for g in self.gpus:  # the same objects stay the handles
                for name, value in vars(fresh[g.uuid]).items():
                    setattr(g, name, value)
            yield
            self._save()

    def update(self, uuid: str, **fields: object) -> None:
        """Change a GPU behind every daemon's back (an operator's nvidia-smi, or a dead daemon's lock)."""
        with self._synced():
            gpu = next(g for g in self.gpus if g.uuid == uuid)
            for name, value in fields.items():
                setattr(gpu, name, value)

    def refresh(self) -> list[FakeGpu]:
        """The GPUs as the store has them now (tests read what a daemon process did)."""
        with self._synced():
            return self.gpus

    def _enter(self, h: FakeGpu, fn: str) -> None:
        """Faults of ``fn`` on ``h``: block (outside the store lock: other GPUs go on), then fail."""
        with self._synced():
            seconds, failing = h.hang.get(fn, 0.0), fn in h.fail
        if seconds:
            self.release.wait(seconds)
        if failing:
            raise NVMLError_Unknown()

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

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        self._check()
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError_InvalidArgument()

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
        self._enter(h, "nvmlDeviceGetClockInfo")
        if clock_type != NVML_CLOCK_SM:
            raise NVMLError_InvalidArgument()
        with self._synced():
            return h.sm_mhz

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        self._enter(h, "nvmlDeviceGetTotalEnergyConsumption")
        with self._synced():
            if not h.has_energy:
                raise NVMLError_NotSupported()
            h.energy_mj += 70_000  # 70 J between two reads
            return h.energy_mj

    def nvmlDeviceSetGpuLockedClocks(self, h: FakeGpu, min_mhz: int, max_mhz: int) -> None:
        self._check()
        self._enter(h, "nvmlDeviceSetGpuLockedClocks")
        with self._synced():
            h.calls.append(("lock", min_mhz, max_mhz))
            if not h.writable:
                raise NVMLError_NoPermission()
            if min_mhz > max_mhz or min_mhz not in h.graphics:
                raise NVMLError_InvalidArgument()
            h.sm_mhz = max_mhz

    def nvmlDeviceResetGpuLockedClocks(self, h: FakeGpu) -> None:
        self._check()
        self._enter(h, "nvmlDeviceResetGpuLockedClocks")
        with self._synced():
            h.calls.append(("reset",))
            if not h.writable:
                raise NVMLError_NoPermission()
            h.sm_mhz = max(h.graphics)


def install(store: str) -> FakeNvml:
    """Make the fake, backed by ``store``, the ``pynvml`` module of this process (a daemon process)."""
    fake = FakeNvml.from_store(store)
    sys.modules["pynvml"] = fake  # type: ignore[assignment]
    return fake

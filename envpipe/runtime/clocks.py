"""Clock setters the runtime calls before a unit whose planned clock differs from the current one.

`SimClock` (CPU, tests, demos): records the clock, stretches each unit's wall time by the frequency
model's slowdown (it sleeps the extra time after the unit) and accrues *simulated* energy.
`DaemonClock`: forwards requests to the envpipe-clockd sidecar through `envpipe.clock.client`
(non-blocking) and reads the GPU's real energy counter.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from envpipe.energy.meter import CounterTrace, nvml_reader
from envpipe.profile import FrequencyModel

log = logging.getLogger(__name__)


class Clock(Protocol):
    energy_label: str  # "simulated" or "measured"
    controls_clocks: bool  # False: requests are only recorded (no daemon): clocks stay as they are
    needs_unit_times: bool  # True: `after_unit` must see every unit (the engine always times units)
    supported_mhz: list[int]  # SM clocks this GPU accepts, descending
    requested: list[int]  # every clock requested so far, in order

    def set(self, mhz: int) -> None:
        """Request an SM clock; must return without waiting for it to apply."""

    def after_unit(self, seconds: float) -> None:
        """Called on the training thread right after a forward/backward unit that took `seconds`."""

    def energy_j(self) -> float | None:
        """Cumulative energy of this GPU, or None when unknown."""

    def close(self) -> None:
        """Release the clock (reset to default where that applies)."""


class SimClock:
    """Emulates a GPU clock on CPU with a frequency model; energy is simulated.

    ``slowdown`` > 1 stretches every unit further, as a slower GPU would (a straggling replica in tests).
    """

    energy_label = "simulated"
    controls_clocks = True
    needs_unit_times = True  # it stretches every unit

    def __init__(self, model: FrequencyModel | None = None, slowdown: float = 1.0) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"a sim clock slowdown must be >= 1, got {slowdown}")
        self.slowdown = slowdown
        self.model = model or FrequencyModel.default()
        self.supported_mhz = list(self.model.clocks_mhz)
        self.mhz = self.model.max_mhz
        self.requested: list[int] = []
        self._busy_j = 0.0
        self._busy_s = 0.0
        self._t0 = time.perf_counter()
        self.trace = CounterTrace()  # the exact simulated counter: knots at unit boundaries
        self.trace.add(self._t0, 0.0)

    def set(self, mhz: int) -> None:
        self.mhz = self.model.nearest_clock(mhz)
        self.requested.append(mhz)

    def after_unit(self, seconds: float) -> None:
        start = time.perf_counter() - seconds
        at_start = self._energy_at(start)
        stretched = seconds * self.model.time_scale(self.mhz) * self.slowdown
        if stretched > seconds:
            time.sleep(stretched - seconds)
        self._busy_s += stretched
        self._busy_j += stretched * self.model.busy_power(self.mhz)
        if start >= (self.trace.last_time or start):
            self.trace.add(start, at_start)
        now = time.perf_counter()
        self.trace.add(now, self._energy_at(now))

    def _energy_at(self, t: float) -> float:
        return self._busy_j + max(0.0, t - self._t0 - self._busy_s) * self.model.idle_power_w

    def energy_j(self) -> float:
        return self._energy_at(time.perf_counter())

    def close(self) -> None:
        self.mhz = self.model.max_mhz


class DaemonClock:
    """Asks envpipe-clockd for clocks of one GPU (by UUID) from a background thread.

    The client call may touch a socket, so the training thread only stores the latest request and
    wakes the worker: a later request supersedes one not yet sent.
    """

    energy_label = "measured"
    controls_clocks = True
    needs_unit_times = False

    def __init__(self, client: object, gpu_uuid: str, supported_mhz: list[int]) -> None:
        self._client = client
        self._uuid = gpu_uuid
        self.supported_mhz = supported_mhz
        self.requested: list[int] = []
        self._pending: int | None = None
        self._cv = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="envpipe-clock", daemon=True)
        self._worker.start()

    def set(self, mhz: int) -> None:
        self.requested.append(mhz)
        with self._cv:
            self._pending = mhz
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                mhz, self._pending = self._pending, None
            try:
                self._client.set(self._uuid, mhz)  # type: ignore[attr-defined]
            except Exception as exc:  # a failed request must not stop training
                log.warning("clock request %d MHz for %s failed: %s", mhz, self._uuid, exc)

    def after_unit(self, seconds: float) -> None:
        return None

    def energy_j(self) -> float | None:
        return float(self._client.energy_mj(self._uuid)) / 1000.0  # type: ignore[attr-defined]

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._worker.join(timeout=5)
        self._client.close()  # type: ignore[attr-defined]


class NvmlEnergyClock:
    """No clock changes (default clocks); real energy from the NVML counter. Used when no daemon runs."""

    energy_label = "measured"
    controls_clocks = False
    needs_unit_times = False

    def __init__(self, device_index: int) -> None:
        import pynvml  # lazily: CPU machines have no NVML

        self._read_j, self._shutdown = nvml_reader(device_index, pynvml)  # the energy meter's NVML reader
        self.supported_mhz = supported_clocks(pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index))
        self.requested: list[int] = []

    def set(self, mhz: int) -> None:
        self.requested.append(mhz)

    def after_unit(self, seconds: float) -> None:
        return None

    def energy_j(self) -> float:
        return self._read_j()

    def close(self) -> None:
        self._shutdown()


def supported_clocks(nvml: Any, handle: Any) -> list[int]:
    """SM clocks supported at the highest memory clock (a read-only NVML query), descending."""
    mem = max(nvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    return sorted({int(f) for f in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem)}, reverse=True)


def gpu_clock(device_index: int, socket_path: str | None = None) -> Clock:
    """The clock for a real GPU: the daemon when it answers, else default clocks with NVML energy."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    supported = supported_clocks(pynvml, handle)
    pynvml.nvmlShutdown()
    try:
        from envpipe.clock.client import ClockClient, ClockDaemonUnavailable
    except ImportError:
        log.warning("envpipe.clock is not installed: running at default clocks (no clock changes)")
        return NvmlEnergyClock(device_index)
    try:
        return DaemonClock(ClockClient(socket_path, gpu_uuids=[uuid]), uuid, supported)
    except ClockDaemonUnavailable as exc:
        log.warning("envpipe-clockd unavailable (%s): running at default clocks (no clock changes)", exc)
        return NvmlEnergyClock(device_index)

"""Clock setters the runtime calls before a unit whose planned clock differs from the current one.

`SimClock` (CPU, tests, demos): records the clock, stretches each unit as the frequency model says
and accrues *simulated* energy. `DaemonClock`: asks the envpipe-clockd sidecar for clocks through
`envpipe.clock.client` (non-blocking; the client's one loop thread does the I/O) and keeps every
refusal for the report. `NvmlEnergyClock`: no clock control (no daemon), the GPU's real energy counter.

`make_clock` decides which one a rank gets *before* the model is built, so a job that asked for clock
control and cannot have it stops at once with one line, and a GPU job without the daemon says in one
line why it runs at default clocks.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from envpipe.energy.meter import CounterTrace, nvml_reader
from envpipe.profile import FrequencyModel
from envpipe.runtime.config import EnvPipeConfig

log = logging.getLogger(__name__)
GPU_UUID_ENV = "ENVPIPE_GPU_UUID"  # the clockd GPU a CPU rank leases (default: the daemon's GPU number LOCAL_RANK)


class ClockUnavailable(RuntimeError):
    """Clock control was asked for and cannot be had here (one line, said before the model is built)."""


@dataclass(frozen=True)
class Refusal:
    """A clock request the daemon refused (HTTP status and its message), for the report."""

    mhz: int
    status: int
    message: str


class Clock(Protocol):
    kind: str  # "sim", "daemon" or "nvml" (energy only)
    energy_label: str  # "simulated" or "measured"
    controls_clocks: bool  # False: requests are only recorded: clocks stay as they are
    needs_unit_times: bool  # True: `after_unit` must see every unit (the engine always times units)
    supported_mhz: list[int]  # SM clocks this GPU accepts, descending
    requested: list[int]  # every clock requested so far, in order
    note: str | None  # why clocks are not controlled, when they are not

    def set(self, mhz: int) -> None:
        """Request an SM clock; must return without waiting for it to apply."""

    def after_unit(self, kind: str, wall_s: float, cpu_s: float) -> None:
        """Called on the training thread right after a forward/backward unit (its wall and CPU time)."""

    def fix_unit_costs(self) -> None:
        """Calibration is over: a simulated GPU fixes its unit costs (nothing to do on a real one)."""

    def energy_j(self) -> float | None:
        """Cumulative energy of this GPU, or None when unknown."""

    def refusals(self) -> list[Refusal]:
        """Requests the clock owner refused so far."""

    def close(self) -> None:
        """Release the clock (reset to default where that applies)."""


class SimClock:
    """Emulates a GPU clock on CPU with a frequency model; energy is simulated.

    The simulated GPU runs a unit in ``dilation`` times the unit's CPU work, scaled by the model's
    slowdown at the current clock; the clock sleeps until that much wall time has passed. Until
    `fix_unit_costs` (the end of calibration) the work is each unit's own CPU time; from then on it is
    fixed per kind (forward, backward) at the median the calibration saw, as a GPU's kernels are. Why:
    on a loaded machine a unit's wall time, and even its CPU time (caches), swing with the neighbours'
    load; a simulated GPU that follows them makes the plan and its baseline differ by noise. The
    dilation makes the simulated GPU slower than the CPU's own work, so the sleeps, not the load, set
    the units' times. With several intra-op threads the training thread's CPU time misses their work,
    so there the wall time stands in for it.
    ``slowdown`` > 1 makes every unit that many times longer, as a slower GPU would (a straggling replica
    in tests): its wall time too, so that the straggler stands out on a loaded machine.
    """

    kind = "sim"
    energy_label = "simulated"
    controls_clocks = True
    needs_unit_times = True  # it stretches every unit
    note: str | None = None

    def __init__(self, model: FrequencyModel | None = None, slowdown: float = 1.0, dilation: float = 1.0) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"a sim clock slowdown must be >= 1, got {slowdown}")
        if not dilation >= 1.0:
            raise ValueError(f"a sim clock dilation must be >= 1, got {dilation}")
        self.slowdown, self.dilation = slowdown, dilation
        self.model = model or FrequencyModel.default()
        self.supported_mhz = list(self.model.clocks_mhz)
        self.mhz = self.model.max_mhz
        self.requested: list[int] = []
        self._work: dict[str, list[float]] = {"F": [], "B": []}  # CPU work per unit, until the costs are fixed
        self.unit_work_s: dict[str, float] | None = None
        self._busy_j = 0.0
        self._busy_s = 0.0
        self._t0 = time.perf_counter()
        self.trace = CounterTrace()  # the exact simulated counter: knots at unit boundaries
        self.trace.add(self._t0, 0.0)

    def set(self, mhz: int) -> None:
        self.mhz = self.model.nearest_clock(mhz)
        self.requested.append(mhz)

    def after_unit(self, kind: str, wall_s: float, cpu_s: float) -> None:
        start = time.perf_counter() - wall_s
        at_start = self._energy_at(start)
        if self.unit_work_s is not None:
            work = self.unit_work_s[kind]
        else:
            work = cpu_s if torch.get_num_threads() == 1 else wall_s
            self._work[kind].append(work)
        gpu_s = work * self.dilation * self.model.time_scale(self.mhz) * self.slowdown
        # a straggler takes `slowdown` times as long as the unit otherwise would, however loaded the machine
        until = max(wall_s * self.slowdown, gpu_s)
        if until > wall_s:
            time.sleep(until - wall_s)
        self._busy_s += gpu_s
        self._busy_j += gpu_s * self.model.busy_power(self.mhz)
        if start >= (self.trace.last_time or start):
            self.trace.add(start, at_start)
        now = time.perf_counter()
        self.trace.add(now, self._energy_at(now))

    def fix_unit_costs(self) -> None:
        """From now on every unit of a kind costs the median CPU work seen so far (calibration)."""
        if self.unit_work_s is None and all(self._work.values()):
            self.unit_work_s = {k: statistics.median(v) for k, v in self._work.items()}

    def _energy_at(self, t: float) -> float:
        return self._busy_j + max(0.0, t - self._t0 - self._busy_s) * self.model.idle_power_w

    def energy_j(self) -> float:
        return self._energy_at(time.perf_counter())

    def refusals(self) -> list[Refusal]:
        return []

    def close(self) -> None:
        self.mhz = self.model.max_mhz


class DaemonClock:
    """Clocks of one GPU (by UUID) from envpipe-clockd.

    `set` only queues the request on the client's loop thread (latest wins), so the training thread
    never waits on the socket. On a GPU the energy is the GPU's own counter (read by the runtime's
    meter); on CPU (a clockd with the sim backend, the containers end-to-end test) ``emulated`` also
    stretches units and accrues simulated energy, so the job runs exactly as with the sim clock while
    every lock goes through the daemon.
    """

    kind = "daemon"
    controls_clocks = True
    note: str | None = None

    def __init__(self, client: Any, gpu_uuid: str, supported_mhz: list[int], emulated: SimClock | None = None,
                 device_index: int = 0) -> None:
        self._client = client
        self.device_index = device_index  # the CUDA device whose NVML counter the runtime's meter reads
        self.gpu_uuid = gpu_uuid
        self.supported_mhz = supported_mhz
        self.emulated = emulated
        self.energy_label = "simulated" if emulated is not None else "measured"
        self.needs_unit_times = emulated is not None
        self.requested: list[int] = []

    def set(self, mhz: int) -> None:
        self.requested.append(mhz)
        self._client.set(self.gpu_uuid, mhz)
        if self.emulated is not None:
            self.emulated.set(mhz)

    def after_unit(self, kind: str, wall_s: float, cpu_s: float) -> None:
        if self.emulated is not None:
            self.emulated.after_unit(kind, wall_s, cpu_s)

    def fix_unit_costs(self) -> None:
        if self.emulated is not None:
            self.emulated.fix_unit_costs()

    def energy_j(self) -> float | None:
        if self.emulated is not None:
            return self.emulated.energy_j()
        return float(self._client.energy_mj(self.gpu_uuid)) / 1000.0

    def refusals(self) -> list[Refusal]:
        return [Refusal(mhz, err.status, str(err.body.get("message", err))) for mhz, err in self._client.refused]

    def close(self) -> None:
        self._client.close()  # ends the lease: the daemon resets the GPU


class NvmlEnergyClock:
    """No clock changes (default clocks); real energy from the NVML counter. Used when no daemon runs."""

    kind = "nvml"
    energy_label = "measured"
    controls_clocks = False
    needs_unit_times = False

    def __init__(self, device_index: int, note: str | None = None) -> None:
        import pynvml  # lazily: CPU machines have no NVML

        self.device_index = device_index
        self._read_j, self._shutdown = nvml_reader(device_index, pynvml)  # the energy meter's NVML reader
        self.supported_mhz = supported_clocks(pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index))
        self.requested: list[int] = []
        self.note = note

    def set(self, mhz: int) -> None:
        self.requested.append(mhz)

    def after_unit(self, kind: str, wall_s: float, cpu_s: float) -> None:
        return None

    def fix_unit_costs(self) -> None:
        return None

    def energy_j(self) -> float:
        return self._read_j()

    def refusals(self) -> list[Refusal]:
        return []

    def close(self) -> None:
        self._shutdown()


def simulated_gpu(clock: Clock | None) -> SimClock | None:
    """The clock's simulated GPU (the sim clock, or the daemon clock's emulation on CPU), if any."""
    return clock if isinstance(clock, SimClock) else getattr(clock, "emulated", None)


def energy_label(clock: Clock | None) -> str:
    """What a rank's energy numbers are: the sim clock's model, the NVML counter, or nothing."""
    if clock is None:
        return "none"
    return "simulated (sim clock)" if simulated_gpu(clock) is not None else "measured (NVML counter)"


def supported_clocks(nvml: Any, handle: Any) -> list[int]:
    """SM clocks supported at the highest memory clock (a read-only NVML query), descending."""
    mem = max(nvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    return sorted({int(f) for f in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem)}, reverse=True)


@dataclass(frozen=True)
class Device:
    """Where a rank trains: a GPU (its CUDA index) or the CPU, and its data-parallel replica."""

    on_gpu: bool
    local_rank: int  # the CUDA device index on a GPU node
    replica: int = 0


def make_clock(
    cfg: EnvPipeConfig, device: Device, slowdown: float = 1.0, environ: Mapping[str, str] | None = None
) -> Clock | None:
    """This rank's clock for ``cfg.clock`` (auto: the daemon on GPUs when it answers, sim on CPU).

    Raises ClockUnavailable (one line) when clock control was asked for explicitly and cannot be had.
    ``slowdown``: the sim clock's extra stretch (an emulated straggler, CPU tests).
    """
    environ = os.environ if environ is None else environ
    kind = cfg.clock
    if kind == "none":
        return None
    if kind == "sim":
        if device.on_gpu:  # the sim clock stretches wall time between units, which GPU timing does not see
            raise ClockUnavailable("envpipe clock 'sim' emulates clocks on CPU only; use 'daemon' or 'auto' on GPUs")
        return SimClock(slowdown=slowdown, dilation=cfg.sim_dilation)
    if kind == "auto" and not device.on_gpu:
        return SimClock(slowdown=slowdown, dilation=cfg.sim_dilation)
    from envpipe.clock.client import SOCKET_ENV, ClockClient, ClockDaemonUnavailable

    socket_path = environ.get(SOCKET_ENV) or None
    try:
        if device.on_gpu:
            uuid, supported = _gpu_identity(device.local_rank)
            return DaemonClock(ClockClient(socket_path, gpu_uuids=[uuid]), uuid, supported,
                               device_index=device.local_rank)
        return _emulated_daemon_clock(socket_path, device, SimClock(slowdown=slowdown, dilation=cfg.sim_dilation),
                                      environ)
    except ClockDaemonUnavailable as exc:
        if kind == "daemon":
            raise ClockUnavailable(f"clock control was asked for (envpipe clock 'daemon') but {exc}") from None
        note = (f"clocks cannot be changed here ({exc}); running at default clocks: every number is measured, "
                "and the plan's saving is predicted (simulated)")
        log.warning("envpipe: %s", note)
        return NvmlEnergyClock(device.local_rank, note)


def _gpu_identity(index: int) -> tuple[str, list[int]]:
    """(UUID, supported SM clocks) of CUDA device ``index`` from NVML (read-only queries)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        return (uuid.decode() if isinstance(uuid, bytes) else uuid), supported_clocks(pynvml, handle)
    finally:
        pynvml.nvmlShutdown()


def _emulated_daemon_clock(
    socket_path: str | None, device: Device, emulated: SimClock, environ: Mapping[str, str]
) -> DaemonClock:
    """A CPU rank's lease on a clockd GPU (``ENVPIPE_GPU_UUID``, else the daemon's GPU number LOCAL_RANK)."""
    from envpipe.clock.client import ClockClient, ClockDaemonUnavailable, list_gpus

    uuid = environ.get(GPU_UUID_ENV)
    gpus = list_gpus(socket_path)
    by_uuid = {g["uuid"]: g for g in gpus}
    if uuid is None:
        if device.local_rank >= len(gpus):
            raise ClockDaemonUnavailable(
                f"envpipe-clockd lists {len(gpus)} GPU(s), none for local rank {device.local_rank} "
                f"(set {GPU_UUID_ENV})")
        uuid = gpus[device.local_rank]["uuid"]
    elif uuid not in by_uuid:
        raise ClockDaemonUnavailable(f"envpipe-clockd has no GPU {uuid} ({GPU_UUID_ENV})")
    supported = sorted((int(f) for f in by_uuid[uuid]["supported_mhz"]), reverse=True)
    client = ClockClient(socket_path, gpu_uuids=[uuid])
    return DaemonClock(client, uuid, supported, emulated=emulated)

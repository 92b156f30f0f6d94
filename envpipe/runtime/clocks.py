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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from envpipe.energy.meter import CounterTrace, EnergyMeter, PolledMeter, SimMeter, nvml_reader, nvml_sm_clock
from envpipe.profile import FrequencyModel
from envpipe.runtime.config import EnvPipeConfig

log = logging.getLogger(__name__)
GPU_UUID_ENV = "ENVPIPE_GPU_UUID"
# The simulated GPUs' link: PCIe 4.0 x16-like (about 25 GB/s and 10 us a message), so that a stage that
# waits for its input sees the wait a real one would, not none
LINK_BYTES_PER_S = 25e9
LINK_LATENCY_S = 10e-6  # the clockd GPU a CPU rank leases (default: the daemon's GPU number LOCAL_RANK)


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

    def after_unit(self, kind: str, wall_s: float, cpu_s: float, flops: float | None = None) -> float | None:
        """Called on the training thread right after a forward/backward unit (its wall and CPU time, and its
        FLOPs while a simulated GPU counts them); a simulated GPU returns the unit's end in its virtual time."""

    def energy_j(self) -> float | None:
        """Cumulative energy of this GPU, or None when unknown."""

    def refusals(self) -> list[Refusal]:
        """Requests the clock owner refused so far."""

    def close(self) -> None:
        """Release the clock (reset to default where that applies)."""


class SimClock:
    """A simulated GPU on CPU: its clock, its own time and its energy (all simulated).

    The simulated GPU keeps **virtual time**: a unit starts when the GPU is free and its input has
    arrived (the sender's virtual time plus the simulated link's transfer time travel with every
    activation and gradient, see envpipe.runtime.engine), and lasts its work scaled by the
    frequency model's slowdown at the current clock; every iteration starts and ends at the same
    virtual time on every rank (the job's collectives); its tail (all-reduce, optimizer step) is
    work too. Until `fix_unit_costs` (after the first calibration iteration) a unit lasts its own CPU
    time; from then on a unit of a kind lasts its FLOPs (torch's FLOP counter, the same in every run) at
    the job's rate (its FLOPs over its CPU seconds in that iteration, one number for every rank: it scales
    every unit alike). Why: on a shared machine wall time, and even CPU time, swing with the neighbours'
    load; a simulated GPU that follows them turns the comparison of a plan with its baseline into noise.
    So two runs of the same job plan alike and report alike, and no unit sleeps. With several intra-op
    threads the training thread's CPU time misses their work, so there the wall time stands in for it.
    ``slowdown`` > 1 makes every unit that many times longer, as a slower GPU would (a straggler in tests).
    """

    kind = "sim"
    energy_label = "simulated"
    controls_clocks = True
    needs_unit_times = True  # every unit advances the virtual time
    note: str | None = None

    def __init__(self, model: FrequencyModel | None = None, slowdown: float = 1.0) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"a sim clock slowdown must be >= 1, got {slowdown}")
        self.slowdown = slowdown
        self.model = model or FrequencyModel.default()
        self.supported_mhz = list(self.model.clocks_mhz)
        self.mhz = self.model.max_mhz
        self.requested: list[int] = []
        self._work: dict[str, list[tuple[float, float]]] = {"F": [], "B": []}  # per unit: (CPU s, FLOPs)
        self.unit_work_s: dict[str, float] | None = None  # per kind, once fixed
        self._tail_work: dict[str, list[float]] = {"reduce": [], "step": []}  # CPU s, until fixed
        self.tail_work_s: dict[str, float] | None = None
        self.vt = 0.0  # virtual time (s): the end of the GPU's last unit, or the iteration's start
        self._ready = 0.0  # when the next unit's input arrives (the latest timestamp received)
        self._start = 0.0  # the running unit's virtual start
        self._busy_j = 0.0
        self._busy_s = 0.0
        self.trace = CounterTrace()  # the exact simulated counter in virtual time: knots at unit boundaries
        self.trace.add(0.0, 0.0)

    def set(self, mhz: int) -> None:
        self.mhz = self.model.nearest_clock(mhz)
        self.requested.append(mhz)

    def now(self) -> float:
        return self.vt

    @staticmethod
    def transfer_s(nbytes: int) -> float:
        """How long the simulated link takes to carry ``nbytes`` between neighbouring GPUs."""
        return LINK_LATENCY_S + nbytes / LINK_BYTES_PER_S

    def data_ready(self, t: float) -> None:
        """An input of the next unit arrived: it was sent at the sender's virtual time ``t``."""
        self._ready = max(self._ready, t)

    def sync(self, t: float) -> None:
        """Every GPU of the job waits for the last one (an iteration's start and end)."""
        self.vt = max(self.vt, t)

    def unit_start(self) -> float:
        """The virtual start of the unit about to run: when the GPU is free and its input is there."""
        self._start = max(self.vt, self._ready)
        return self._start

    @property
    def counting(self) -> bool:
        """Units still measure their own work (their FLOPs are counted)."""
        return self.unit_work_s is None

    def after_unit(self, kind: str, wall_s: float, cpu_s: float, flops: float | None = None) -> float:
        """The unit's virtual end."""
        if self.unit_work_s is not None:
            work = self.unit_work_s[kind]
        else:
            work = cpu_s if torch.get_num_threads() == 1 else wall_s
            self._work[kind].append((work, flops or 0.0))
        gpu_s = work * self.model.time_scale(self.mhz) * self.slowdown
        if self._start > (self.trace.last_time or 0.0):
            self.trace.add(self._start, self.energy_at(self._start))  # idle until the unit starts
        self._busy_s += gpu_s
        self._busy_j += gpu_s * self.model.busy_power(self.mhz)
        self.vt = self._start + gpu_s
        self.trace.add(self.vt, self.energy_at(self.vt))
        return self.vt

    def after_tail(self, part: str, cpu_s: float) -> float:
        """The iteration's tail on this GPU (``reduce``: the gradient all-reduce, ``step``: the optimizer step)
        lasts its CPU time until the costs are fixed, then the calibration's median: the virtual end."""
        if self.tail_work_s is not None:
            work = self.tail_work_s[part]
        else:
            work = cpu_s
            self._tail_work[part].append(cpu_s)
        self._busy_s += work
        self._busy_j += work * self.model.busy_power(self.mhz)
        self.vt += work
        self.trace.add(self.vt, self.energy_at(self.vt))
        return self.vt

    def calibration_work(self) -> tuple[float, float]:
        """(CPU seconds, FLOPs) of every unit so far."""
        units = [u for us in self._work.values() for u in us]
        return sum(c for c, _ in units), sum(f for _, f in units)

    def fix_unit_costs(self, flops_per_s: float) -> None:
        """From now on a unit of a kind lasts its median FLOPs at ``flops_per_s`` (the job's rate); where no
        FLOPs were counted, its median CPU work."""
        if self.unit_work_s is not None or not all(self._work.values()):
            return
        counted = flops_per_s > 0 and all(f > 0 for us in self._work.values() for _, f in us)
        self.unit_work_s = {k: statistics.median(f / flops_per_s if counted else c for c, f in us)
                            for k, us in self._work.items()}
        self.tail_work_s = {k: statistics.median(v) if v else 0.0 for k, v in self._tail_work.items()}

    def energy_at(self, t: float) -> float:
        """The counter at virtual time ``t`` (not before the last unit's end): blocking power when idle."""
        return self._busy_j + max(0.0, t - self._busy_s) * self.model.idle_power_w

    def energy_j(self) -> float:
        return self.energy_at(self.vt)

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

    def after_unit(self, kind: str, wall_s: float, cpu_s: float, flops: float | None = None) -> float | None:
        return None if self.emulated is None else self.emulated.after_unit(kind, wall_s, cpu_s, flops)

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

    def after_unit(self, kind: str, wall_s: float, cpu_s: float, flops: float | None = None) -> float | None:
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


def time_label(clock: Clock | None) -> str:
    """What a rank's times are: the simulated GPU's virtual time on CPU, else the wall clock."""
    return "simulated (sim clock's GPU time)" if simulated_gpu(clock) is not None else "measured (wall clock)"


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
    if kind == "readonly":  # energy only: NVML's counter, clocks left as they are
        return NvmlEnergyClock(device.local_rank, "clock 'readonly': clocks are left as they are; every number is "
                               "measured, and the plan's saving is predicted (simulated)")
    if kind == "sim":
        if device.on_gpu:  # the sim clock stretches wall time between units, which GPU timing does not see
            raise ClockUnavailable("envpipe clock 'sim' emulates clocks on CPU only; use 'daemon' or 'auto' on GPUs")
        return SimClock(slowdown=slowdown)
    if kind == "auto" and not device.on_gpu:
        return SimClock(slowdown=slowdown)
    from envpipe.clock.client import SOCKET_ENV, ClockClient, ClockDaemonUnavailable

    socket_path = environ.get(SOCKET_ENV) or None
    try:
        if device.on_gpu:
            uuid, supported = _gpu_identity(device.local_rank)
            return DaemonClock(ClockClient(socket_path, gpu_uuids=[uuid]), uuid, supported,
                               device_index=device.local_rank)
        return _emulated_daemon_clock(socket_path, device, SimClock(slowdown=slowdown), environ)
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


def make_meter(clock: Clock | None) -> EnergyMeter | None:
    """The simulated GPU's exact counter, or the clock's GPU's NVML counter (and SM clock) polled in the background."""
    sim = simulated_gpu(clock)
    if sim is not None:
        return SimMeter(sim.trace, sim.energy_at)
    if clock is None:
        return None
    index = getattr(clock, "device_index", 0)
    read_j, close_j = nvml_reader(index)
    read_mhz, close_mhz = nvml_sm_clock(index)

    def close() -> None:
        close_mhz()
        close_j()

    return PolledMeter(read_j, on_close=close, read_clock_mhz=read_mhz)

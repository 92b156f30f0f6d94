"""Clock setters the runtime calls before a unit whose planned clock differs from the current one.

`SimClock` (CPU, tests, demos): the clock of a simulated GPU (envpipe.simgpu), whose units, energy and
virtual time the engine runs; *simulated*. `DaemonClock`: asks the envpipe-clockd sidecar for clocks through
`envpipe.clock.client` (non-blocking; the client's one loop thread does the I/O) and keeps every
refusal for the report. `NvmlEnergyClock`: no clock control (no daemon), the GPU's real energy counter.

`make_clock` decides which one a rank gets *before* the model is built, so a job that asked for clock
control and cannot have it stops at once with one line, and a GPU job without the daemon says in one
line why it runs at default clocks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from envpipe.energy.meter import EnergyMeter, PolledMeter, SimMeter, nvml_handle, nvml_id, nvml_reader, nvml_sm_clock
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.summary import Refusal
from envpipe.simgpu import JobTruth, SimGpu
from envpipe.simgpu.gpu import Cold

log = logging.getLogger(__name__)
GPU_UUID_ENV = "ENVPIPE_GPU_UUID"  # the clockd GPU a CPU rank leases (default: the daemon's GPU number LOCAL_RANK)


class ClockUnavailable(RuntimeError):
    """Clock control was asked for and cannot be had here (one line, said before the model is built)."""


class Clock(Protocol):
    kind: str  # "sim", "daemon" or "nvml" (energy only)
    energy_label: str  # "simulated" or "measured"
    controls_clocks: bool  # False: requests are only recorded: clocks stay as they are
    needs_unit_times: bool  # True: `after_unit` must see every unit (the engine always times units)
    supported_mhz: list[int]  # SM clocks this GPU accepts, descending
    note: str | None  # why clocks are not controlled, when they are not
    device_index: int | str | None  # the GPU whose NVML counter the runtime's meter reads (None: a simulated GPU)
    sim_gpu: SimGpu | None  # the simulated GPU the engine runs units on (CPU), if any

    def set(self, mhz: int) -> None:
        """Request an SM clock; must return without waiting for it to apply."""

    def energy_j(self) -> float | None:
        """Cumulative energy of this GPU, or None when unknown."""

    def refusals(self, rank: int) -> list[Refusal]:
        """Requests the clock owner refused so far, as this rank's."""

    def lost_control(self) -> tuple[float, int] | None:
        """(seconds without a lease and its clocks, new leases opened) where a daemon owns the clocks, else None."""

    def close(self) -> None:
        """Release the clock (reset to default where that applies)."""


class SimClock:
    """The clock of a simulated GPU on CPU (envpipe.simgpu.SimGpu): requests lock the simulated GPU's clock.

    The GPU itself keeps virtual time and its energy counter; the engine runs every unit, transfer and tail on
    it (envpipe.runtime.engine.engine), so the runtime sees it as it would a real GPU: by timing and metering, never
    by reading its hidden truth. All its numbers are simulated.
    """

    kind = "sim"
    energy_label = "simulated"
    needs_unit_times = True  # every unit advances the virtual time
    device_index: int | str | None = None

    def __init__(self, gpu: SimGpu, controls: bool = True) -> None:
        """``controls`` False: the simulated GPU of a node without the clock daemon (requests change nothing)."""
        self.gpu = gpu
        self.sim_gpu: SimGpu | None = gpu
        self.supported_mhz = list(gpu.supported_mhz)
        self.controls_clocks = controls
        self.note: str | None = None if controls else (
            "clock 'sim-readonly': the simulated GPU's clocks cannot be set (as on a GPU node without envpipe-clockd); "
            "every number is the simulated GPU's")

    def set(self, mhz: int) -> None:
        if self.controls_clocks:
            self.gpu.set_clock(mhz)

    def energy_j(self) -> float:
        return self.gpu.energy_j()

    def refusals(self, rank: int) -> list[Refusal]:
        return []

    def lost_control(self) -> None:
        return None

    def close(self) -> None:
        self.gpu.set_clock(self.gpu.max_mhz)


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
                 device_index: int | str = 0) -> None:
        self._client = client
        self.device_index: int | str | None = device_index  # `nvml_id` of the GPU
        self.gpu_uuid = gpu_uuid
        self.supported_mhz = supported_mhz
        self.emulated = emulated
        self.sim_gpu = None if emulated is None else emulated.gpu
        self.energy_label = "simulated" if emulated is not None else "measured"
        self.needs_unit_times = emulated is not None

    def set(self, mhz: int) -> None:
        self._client.set(self.gpu_uuid, mhz)
        if self.emulated is not None:
            self.emulated.set(mhz)

    def energy_j(self) -> float | None:
        if self.emulated is not None:
            return self.emulated.energy_j()
        return float(self._client.energy_mj(self.gpu_uuid)) / 1000.0

    def refusals(self, rank: int) -> list[Refusal]:
        return [Refusal(rank, mhz, err.status, str(err.body.get("message", err))) for mhz, err in self._client.refused]

    def lost_control(self) -> tuple[float, int]:
        """(seconds without a lease and its clocks, new leases opened): the daemon restarted under the job."""
        return self._client.uncontrolled_s(), self._client.reattaches

    def close(self) -> None:
        self._client.close()  # ends the lease: the daemon resets the GPU


class NvmlEnergyClock:
    """No clock changes (default clocks); real energy from the NVML counter. Used when no daemon runs."""

    kind = "nvml"
    energy_label = "measured"
    controls_clocks = False
    needs_unit_times = False
    sim_gpu: SimGpu | None = None

    def __init__(self, cuda_index: int, note: str | None = None) -> None:
        import pynvml  # lazily: CPU machines have no NVML

        self.device_index: int | str | None = nvml_id(cuda_index)
        self._read_j, self._shutdown = nvml_reader(self.device_index, pynvml)  # the energy meter's NVML reader
        self.supported_mhz = supported_clocks(pynvml, nvml_handle(pynvml, self.device_index))
        self.note = note

    def set(self, mhz: int) -> None:
        return None  # clocks stay as they are

    def energy_j(self) -> float:
        return self._read_j()

    def refusals(self, rank: int) -> list[Refusal]:
        return []

    def lost_control(self) -> None:
        return None

    def close(self) -> None:
        self._shutdown()


def simulated_gpu(clock: Clock | None) -> SimGpu | None:
    """The clock's simulated GPU (the sim clock's, or the daemon clock's emulation on CPU), if any."""
    return None if clock is None else clock.sim_gpu


def energy_label(clock: Clock | None) -> str:
    """What a rank's energy numbers are: a simulated GPU's counter, the NVML counter, or nothing."""
    if clock is None:
        return "none"
    return "simulated GPU" if simulated_gpu(clock) is not None else "measured (NVML counter)"


def time_label(clock: Clock | None) -> str:
    """What a rank's times are: a simulated GPU's virtual time on CPU, else the wall clock."""
    return "simulated GPU" if simulated_gpu(clock) is not None else "measured (wall clock)"


def supported_clocks(nvml: Any, handle: Any) -> list[int]:
    """SM clocks supported at the highest memory clock (a read-only NVML query), descending."""
    mem = max(nvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    return sorted({int(f) for f in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem)}, reverse=True)


@dataclass(frozen=True)
class Device:
    """Where a rank trains: a GPU (its CUDA index) or the CPU, its pipeline stage and data-parallel replica."""

    on_gpu: bool
    local_rank: int  # the CUDA device index on a GPU node
    replica: int = 0
    stage: int = 0
    stages: int = 1


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
    if kind in ("sim", "sim-readonly"):
        if device.on_gpu:  # a simulated GPU keeps virtual time, which GPU timing does not see
            raise ClockUnavailable(f"envpipe clock '{kind}' emulates clocks on CPU only; use 'daemon' or 'auto' "
                                   "on GPUs")
        return sim_clock(device, slowdown, controls=kind == "sim")
    if kind == "auto" and not device.on_gpu:
        return sim_clock(device, slowdown)
    from envpipe.clock.client import SOCKET_ENV, ClockClient, ClockDaemonUnavailable

    socket_path = environ.get(SOCKET_ENV) or None
    try:
        if device.on_gpu:
            uuid, supported = _gpu_identity(device.local_rank)
            return DaemonClock(ClockClient(socket_path, gpu_uuids=[uuid]), uuid, supported,
                               device_index=nvml_id(device.local_rank))
        return _emulated_daemon_clock(socket_path, device, sim_clock(device, slowdown), environ)
    except ClockDaemonUnavailable as exc:
        if kind == "daemon":
            raise ClockUnavailable(f"clock control was asked for (envpipe clock 'daemon') but {exc}") from None
        note = (f"clocks cannot be changed here ({exc}); running at default clocks: every number is measured, "
                "and the plan's saving is predicted (simulated)")
        log.warning("envpipe: %s", note)
        return NvmlEnergyClock(device.local_rank, note)


def sim_clock(device: Device, slowdown: float = 1.0, controls: bool = True) -> SimClock:
    """The clock of this rank's simulated GPU: its stage's share of the job's hidden truth (envpipe.simgpu)."""
    gpu = SimGpu(JobTruth.embedded(device.stages), device.stage, device.replica, slowdown=slowdown,
                 cold=Cold.of_stage(device.stage, os.environ))
    return SimClock(gpu, controls)


def _gpu_identity(index: int) -> tuple[str, list[int]]:
    """(UUID, supported SM clocks) of CUDA device ``index`` from NVML (read-only queries)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = nvml_handle(pynvml, nvml_id(index))
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
    gpu = 0 if clock.device_index is None else clock.device_index
    read_j, close_j = nvml_reader(gpu)
    read_mhz, close_mhz = nvml_sm_clock(gpu)

    def close() -> None:
        close_mhz()
        close_j()

    return PolledMeter(read_j, on_close=close, read_clock_mhz=read_mhz)

"""A cumulative energy counter as a function of host time, and meters that fill it.

`CounterTrace` keeps (host time, joules) knots and interpolates linearly between them, so the energy
of any interval (a pipeline unit) is ``at(end) - at(start)``.

- `PolledMeter`: a background thread reads a real cumulative counter (NVML's
  ``nvmlDeviceGetTotalEnergyConsumption``, mJ) every ``period_s``. The counter advances in steps (the
  driver updates it every few to tens of milliseconds), so only the first sample of each new value is
  kept, stamped with the host time it was first seen: the knots are the update moments and the
  interpolation spreads each update's energy over the time since the previous one. An interval is
  answerable once a knot at or after its end exists (``wait_until``).
- `SimMeter`: the exact counter of the simulated GPU (`envpipe.runtime.clocks.SimClock`), whose
  knots are unit boundaries; energy is **simulated**.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


class CounterTrace:
    """Knots (host time from ``time.perf_counter``, cumulative joules), times non-decreasing."""

    def __init__(self) -> None:
        self._t: list[float] = []
        self._j: list[float] = []
        self._lock = threading.Lock()

    def add(self, t: float, joules: float) -> None:
        with self._lock:
            if self._t and t < self._t[-1]:
                raise ValueError("counter knots must come in time order")
            self._t.append(t)
            self._j.append(joules)

    def __len__(self) -> int:
        return len(self._t)

    @property
    def last_time(self) -> float | None:
        with self._lock:
            return self._t[-1] if self._t else None

    def at(self, times: float | np.ndarray) -> np.ndarray:
        """Interpolated cumulative energy at host time(s); outside the knots the end values hold."""
        with self._lock:
            if not self._t:
                raise ValueError("the energy counter has no samples yet")
            t, j = np.asarray(self._t), np.asarray(self._j)
        return np.interp(np.asarray(times, float), t, j)

    def between(self, start: np.ndarray | float, end: np.ndarray | float) -> np.ndarray:
        """Energy (J) of each interval [start, end]."""
        return self.at(end) - self.at(start)

    def trim(self, before: float) -> None:
        """Forget knots older than ``before`` (keeping the last one before it, to interpolate from)."""
        with self._lock:
            keep = max(0, int(np.searchsorted(np.asarray(self._t), before, side="right")) - 1)
            del self._t[:keep], self._j[:keep]

    def update_intervals(self) -> np.ndarray:
        """Seconds between consecutive knots (the counter's update period for a polled counter)."""
        with self._lock:
            return np.diff(np.asarray(self._t))


class EnergyMeter(Protocol):
    label: str  # "measured" or "simulated"
    trace: CounterTrace
    resolution_s: float  # how often the counter moves: an interval much shorter reads an interpolated guess
    # True: a GPU's counter polled in the background, too coarse for a bubble, that also reads the SM clock while
    # `sample_clocks` is on (into `clock_samples`: host time, MHz); False: an exact counter, no clock to read
    polled: bool
    sample_clocks: bool
    clock_samples: list[tuple[float, float]]

    def wait_until(self, t: float, timeout_s: float = 2.0) -> bool:
        """Block until the trace covers host time ``t``; False on timeout."""

    def close(self) -> None: ...


# NVML's counter moves about every 100 ms on H200 (measured); 5 ms stamps its updates well enough
# while taking little GIL time from the training thread
METER_PERIOD_S = 0.005
NVML_UPDATE_S = 0.1
CLOCK_EVERY = 1  # the SM clock is read every this many polls, and only while the runtime asks (calibration)


class PolledMeter:
    """Samples ``read_j()`` (a cumulative counter in joules) in a background thread."""

    label = "measured"
    resolution_s = NVML_UPDATE_S
    polled = True

    def __init__(
        self,
        read_j: Callable[[], float],
        period_s: float = METER_PERIOD_S,
        on_close: Callable[[], None] | None = None,
        read_clock_mhz: Callable[[], float] | None = None,
    ) -> None:
        if period_s <= 0:
            raise ValueError("the polling period must be positive")
        self._read, self.period_s, self._on_close = read_j, period_s, on_close
        self._read_clock = read_clock_mhz
        self.clock_samples: list[tuple[float, float]] = []  # (host time, SM clock MHz) while sampling is on
        self.sample_clocks = False  # the runtime turns it on around calibration (power-capped clocks)
        self.trace = CounterTrace()
        self._last: float | None = None
        self._stop = threading.Event()
        self._new = threading.Condition()
        self.error: Exception | None = None
        self._sample()  # the first knot, and a clear error now if the counter cannot be read
        self._thread = threading.Thread(target=self._run, name="envpipe-energy", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        value = float(self._read())
        now = time.perf_counter()
        if value != self._last:
            self.trace.add(now, value)
            self._last = value
            with self._new:
                self._new.notify_all()

    def _run(self) -> None:
        polls = 0
        while not self._stop.wait(self.period_s):
            polls += 1
            try:
                self._sample()
                if self.sample_clocks and self._read_clock is not None and polls % CLOCK_EVERY == 0:
                    self.clock_samples.append((time.perf_counter(), float(self._read_clock())))
            except Exception as exc:  # a failing counter ends metering, never training
                self.error = exc
                with self._new:
                    self._new.notify_all()
                return

    def wait_until(self, t: float, timeout_s: float = 2.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._new:
            while (self.trace.last_time or -np.inf) < t and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._new.wait(left)
        return self.error is None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


class SimMeter:
    """The simulated GPU's exact counter in its virtual time (knots at unit boundaries, idle power between)."""

    label = "simulated"
    resolution_s = 0.0  # exact: knots at every unit boundary
    polled = False

    def __init__(self, trace: CounterTrace, energy_at: Callable[[float], float]) -> None:
        self.trace = trace
        self._energy_at = energy_at
        self.sample_clocks = False  # no SM clock to read: it stays off
        self.clock_samples: list[tuple[float, float]] = []

    def wait_until(self, t: float, timeout_s: float = 2.0) -> bool:
        if (self.trace.last_time or -np.inf) < t:  # idle since the last unit: the counter at t is known
            self.trace.add(t, self._energy_at(t))
        return True

    def close(self) -> None:
        return None


def nvml_id(cuda_index: int) -> int | str:
    """How NVML names CUDA device ``cuda_index`` of this process: its UUID. NVML numbers the host's GPUs in PCI order,
    whatever CUDA_VISIBLE_DEVICES shows the process, so an index would meter (or lock) another job's GPU. Without
    CUDA (CPU tests against a fake NVML) the index itself."""
    import torch

    if not torch.cuda.is_available():
        return cuda_index
    return f"GPU-{torch.cuda.get_device_properties(cuda_index).uuid}"


def nvml_handle(nvml: Any, gpu: int | str) -> Any:
    """The NVML handle of ``gpu``: a UUID ("GPU-..."), or NVML's own index (NVML numbers every GPU of the host in
    PCI order, whatever CUDA_VISIBLE_DEVICES shows a process: a CUDA index is not an NVML index)."""
    return nvml.nvmlDeviceGetHandleByUUID(gpu) if isinstance(gpu, str) else nvml.nvmlDeviceGetHandleByIndex(gpu)


def nvml_reader(gpu: int | str, nvml: Any = None) -> tuple[Callable[[], float], Callable[[], None]]:
    """(read joules, shutdown) for one GPU's NVML energy counter (read-only; ``nvml`` defaults to pynvml)."""
    if nvml is None:
        import pynvml

        nvml = pynvml
    nvml.nvmlInit()
    handle = nvml_handle(nvml, gpu)
    return (lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0), nvml.nvmlShutdown


def nvml_sm_clock(gpu: int | str, nvml: Any = None) -> tuple[Callable[[], float], Callable[[], None]]:
    """(read the current SM clock in MHz, shutdown) for one GPU (read-only; ``nvml`` defaults to pynvml)."""
    if nvml is None:
        import pynvml

        nvml = pynvml
    nvml.nvmlInit()
    handle = nvml_handle(nvml, gpu)
    return (lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))), nvml.nvmlShutdown


def clock_under_load(samples: list[tuple[float, float]], busy: list[tuple[float, float]]) -> float | None:
    """Median SM clock over the samples taken inside the busy intervals (host times); None without any.

    Give the units' intervals; where none holds a sample (units shorter than the polling period), the
    iterations' intervals: a pipeline stage is busy for most of its iteration."""
    if not samples or not busy:
        return None
    t = np.asarray([x for x, _ in samples])
    mhz = np.asarray([y for _, y in samples])
    spans = np.asarray(busy, float)
    spans = spans[np.argsort(spans[:, 0])]
    i = np.searchsorted(spans[:, 0], t, side="right") - 1
    inside = (i >= 0) & (t <= spans[np.clip(i, 0, None), 1])
    return float(np.median(mhz[inside])) if inside.any() else None

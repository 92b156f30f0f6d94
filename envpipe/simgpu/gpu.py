"""One simulated GPU in virtual time: its clock, its units, its link, its tail and its exact energy counter.

Virtual time does not depend on the machine: a unit starts when the GPU is free and its input has arrived
(the sender's virtual time plus the link's transfer, `data_ready`), lasts its work (`envpipe.simgpu.cost`)
stretched by the hidden truth at the current clock (`envpipe.simgpu.truth`), times measurement noise, and
draws the truth's power, times noise. Between units the GPU draws its blocking power. The energy counter
(an `envpipe.energy.meter.CounterTrace` in virtual time, knots at every start and end) is exact.

Noise: every unit's (and tail's) time and power are multiplied by ``1 + 0.01 z`` with z standard normal,
clipped to +-3: a real GPU's repeated units differ by about that much. It is seeded: the draws come in the
order the GPU runs its units from a generator seeded by (seed, stage, replica), so two runs of the same job
give the same numbers to the last digit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from envpipe.energy.meter import CounterTrace
from envpipe.simgpu.cost import LINK, Link, unit_s
from envpipe.simgpu.truth import KINDS, JobTruth

NOISE = 0.01  # relative standard deviation of a unit's time and of its power
NOISE_CLIP = 3.0  # in standard deviations
COLD_ENV = "ENVPIPE_SIM_COLD_STAGE"  # "STAGE:UNITS:FACTOR": that stage's first UNITS units take FACTOR x their time


@dataclass(frozen=True)
class Cold:
    """A GPU's first ``units`` units take ``factor`` times their time. Real unit times drift after the first
    iterations: on 2 x H200 (2026-11-28, clocks untouched) a Llama stage's forwards ran 5 % faster in the steady
    phase than in calibration and its neighbour's 3 % slower, so a plan made on the calibration misjudged the
    slack between them."""

    units: int
    factor: float

    @classmethod
    def of_stage(cls, stage: int, environ: Mapping[str, str]) -> Cold | None:
        """From ENVPIPE_SIM_COLD_STAGE=STAGE:UNITS:FACTOR (CPU tests): that stage's, else None."""
        value = environ.get(COLD_ENV, "")
        if not value:
            return None
        try:
            who, units, factor = value.split(":")
            cold = cls(int(units), float(factor))
            which = int(who)
        except ValueError:
            raise ValueError(f"{COLD_ENV}={value!r}: expected STAGE:UNITS:FACTOR, e.g. 1:32:1.3") from None
        if cold.units < 0 or not (np.isfinite(cold.factor) and cold.factor > 0):
            raise ValueError(f"{COLD_ENV}={value!r}: UNITS must be >= 0 and FACTOR a finite number > 0")
        return cold if which == stage else None


class SimGpu:
    """The simulated GPU of one pipeline stage (of one data-parallel replica). Its numbers are simulated."""

    def __init__(self, job: JobTruth, stage: int, replica: int = 0, seed: int = 0, link: Link = LINK,
                 slowdown: float = 1.0, noise: float = NOISE, cold: Cold | None = None) -> None:
        """The GPU of ``stage`` (of ``replica``) in a job whose hidden truth is ``job``. ``slowdown`` > 1 makes
        every unit and tail that many times longer, as a slower GPU would (a straggler); ``cold``: its first
        units run slower (a GPU whose unit times drift once the job is under way)."""
        if not slowdown >= 1.0:
            raise ValueError(f"a simulated GPU's slowdown must be >= 1, got {slowdown!r}")
        if not 0.0 <= noise < 1.0 / NOISE_CLIP:
            raise ValueError(f"noise must be in [0, {1 / NOISE_CLIP:.3f}), got {noise!r}")
        if not (isinstance(seed, int) and seed >= 0):
            raise ValueError(f"a seed is a non-negative integer, got {seed!r}")
        self._truth = job.stage(stage)  # hidden: the runtime learns it only by running units (refuses a bad stage)
        self.stage, self.replica = stage, replica
        self.link, self.slowdown, self.noise = link, slowdown, noise
        self.cold = cold if cold is not None else Cold(0, 1.0)
        self._units_run = 0  # units ended so far (the first `cold.units` ran cold)
        self._rng = np.random.default_rng([seed, stage, replica])
        self.supported_mhz = list(self._truth.clocks_mhz)  # descending
        self.mhz = self.max_mhz
        self.unit_flops: dict[str, float] = {}  # per kind, the FLOPs last counted for it
        self.vt = 0.0  # virtual time (s): the end of the GPU's last work, or when it was last synced
        self._ready = 0.0  # when the next unit's input arrives (the latest stamp received)
        self._start: float | None = None  # the running unit's virtual start
        self._stretch_s = 0.0  # the running unit's rehearsal delay (`stretch`)
        self._busy_s = self._busy_j = 0.0
        self.trace = CounterTrace()  # the exact counter in virtual time
        self.trace.add(0.0, 0.0)

    @property
    def max_mhz(self) -> int:
        return self.supported_mhz[0]

    def set_clock(self, mhz: int) -> int:
        """Lock the SM clock at the supported clock nearest ``mhz`` (as a driver snaps a request); returns it."""
        arr = np.asarray(self.supported_mhz)
        self.mhz = int(arr[int(np.argmin(np.abs(arr - mhz)))])
        return self.mhz

    def now(self) -> float:
        return self.vt

    def transfer_s(self, nbytes: int) -> float:
        """How long the link takes to carry ``nbytes`` to a neighbouring GPU."""
        return self.link.transfer_s(nbytes)

    def data_ready(self, t: float) -> None:
        """An input of the next unit arrived: sent at the sender's virtual time (plus transfer) ``t``."""
        self._ready = max(self._ready, t)

    def sync(self, t: float) -> None:
        """Wait (blocked) until virtual time ``t``: every GPU of the job waits for the last at an iteration's ends."""
        self.vt = max(self.vt, t)

    def idle(self, seconds: float) -> float:
        """Stay blocked for ``seconds`` (a profiler reading the blocking power); returns the virtual time."""
        if not seconds >= 0:
            raise ValueError(f"idle time must be non-negative, got {seconds!r}")
        self.vt += seconds
        self.trace.add(self.vt, self.energy_at(self.vt))
        return self.vt

    def needs_flops(self, kind: str) -> bool:
        """True until a unit of ``kind`` has had its FLOPs counted (later units of the kind reuse them)."""
        return kind not in self.unit_flops

    def unit_start(self) -> float:
        """The virtual start of the unit about to run: when the GPU is free and its input is there."""
        if self._start is not None:
            raise RuntimeError("a unit is already running on this simulated GPU")
        start = self._start = max(self.vt, self._ready)
        if start > (self.trace.last_time or 0.0):
            self.trace.add(start, self.energy_at(start))  # blocked until the unit starts
        return start

    def stretch(self, seconds: float) -> None:
        """Delay the running unit's end by ``seconds`` after its work, drawing the blocking power meanwhile, as a
        real GPU does while a one-thread kernel spins on its timer (a rehearsal's stretch:
        envpipe.runtime.phases.rehearse)."""
        if self._start is None:
            raise RuntimeError("a stretch belongs to a running unit")
        if not seconds >= 0:
            raise ValueError(f"a stretch lasts a non-negative time, got {seconds!r}")
        self._stretch_s += seconds

    def unit_end(self, kind: str, flops: float | None = None) -> float:
        """End the unit `unit_start` began: ``flops`` counted for it, or None for its kind's last count.
        Returns its virtual end."""
        if self._start is None:
            raise RuntimeError("unit_end without unit_start")
        if kind not in KINDS:
            raise ValueError(f"a unit is 'F' or 'B', got {kind!r}")
        if flops is not None:
            unit_s(flops)  # refuses a negative or NaN count here, before it is kept
            self.unit_flops[kind] = float(flops)
        elif kind not in self.unit_flops:
            raise ValueError(f"no FLOPs counted yet for a {kind} unit of this GPU")
        cold = self.cold.factor if self._units_run < self.cold.units else 1.0
        self._units_run += 1
        seconds, watts = self._truth.unit(kind, self.mhz, unit_s(self.unit_flops[kind]) * self.slowdown * cold)
        start, self._start = self._start, None
        end = self._busy(start, seconds, watts)
        if self._stretch_s:  # spinning: blocked power, exactly the asked time (no noise: a timer, not work)
            self.vt, self._stretch_s = end + self._stretch_s, 0.0
            self.trace.add(self.vt, self.energy_at(self.vt))
        return self.vt

    def tail(self, top_s: float) -> float:
        """Run a tail part (an all-reduce: `Link.allreduce_s`; an optimizer step: `cost.step_s`) of ``top_s``
        seconds right after the GPU's last work; it does not stretch with the clock. Returns its virtual end."""
        if self._start is not None:
            raise RuntimeError("a tail cannot start while a unit runs")
        if not top_s >= 0:
            raise ValueError(f"a tail lasts a non-negative time, got {top_s!r}")
        return self._busy(self.vt, top_s * self.slowdown, self._truth.tail_power_w(self.mhz))

    def _busy(self, start: float, seconds: float, watts: float) -> float:
        z_t, z_p = np.clip(self._rng.standard_normal(2), -NOISE_CLIP, NOISE_CLIP)
        seconds *= 1.0 + self.noise * z_t
        self._busy_s += seconds
        self._busy_j += seconds * watts * (1.0 + self.noise * z_p)
        self.vt = start + seconds
        self.trace.add(self.vt, self.energy_at(self.vt))
        return self.vt

    def energy_at(self, t: float) -> float:
        """The counter (J) at virtual time ``t``, not before the end of the GPU's last work: blocking power since."""
        return self._busy_j + max(0.0, t - self._busy_s) * self._truth.blocking_w

    def energy_j(self) -> float:
        return self.energy_at(self.vt)

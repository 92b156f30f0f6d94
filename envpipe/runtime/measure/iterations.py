"""Every iteration of a rank: its JSON line, its energy from the meter, and the job's view of them.

A rank's iteration energy is read from its meter's counter trace at the iteration's start and end (host
times), once the trace covers the end. The training thread never waits for that: a line is written as
soon as its energy is known (usually one iteration later), and the rest when the log closes.

`iterations.rank<r>.jsonl`, one line per iteration: phase (calibrate, profile@MHz, reconfigure, steady),
what ran (`plan`, or `baseline`: 1F1B with every clock at max), when it ended (wall clock), its time and the
job's samples per second (with what kind of time it is), this GPU's energy and its label, clocks requested,
loss, whether units were timed. A resumed run appends to the same file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envpipe.energy.meter import EnergyMeter

PLAN, BASELINE = "plan", "baseline"


@dataclass
class Iteration:
    index: int  # this run's iteration count (the same on every rank)
    phase: str
    runs: str  # PLAN or BASELINE
    start: float  # host time (time.perf_counter), or a simulated GPU's virtual time
    end: float
    wall_time: float  # when it ended, seconds since the epoch (time.time)
    samples: int  # samples the job trained in it (every replica)
    global_samples: int  # DeepSpeed's count after it (the monitors' step)
    clocks_requested: list[int]
    loss: float | None
    units_timed: bool
    extra: dict[str, Any] = field(default_factory=dict)
    energy_j: float | None = None

    @property
    def time_s(self) -> float:
        return self.end - self.start


class IterationLog:
    """This rank's iterations, written as JSON lines once their energy is known, then handed to ``on_done``
    in order (the steady phase's record and the monitor keep what they need; the log keeps nothing)."""

    def __init__(self, path: Path, stage: int, meter: EnergyMeter | None, labels: tuple[str, str],
                 on_done: Callable[[Iteration], None]) -> None:
        """``labels``: what the energy and the time are (measured, or simulated from which model)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.stage, self.meter = stage, meter
        self.energy, self.time_label = labels
        self._on_done = on_done
        self._waiting: list[Iteration] = []
        self._file = path.open("a")

    def add(self, it: Iteration) -> None:
        self._waiting.append(it)
        self.write_known(wait=False)

    def write_known(self, wait: bool) -> None:
        """Write every iteration whose energy the meter knows (``wait``: block until it knows them all)."""
        while self._waiting:
            it = self._waiting[0]
            if self.meter is not None:
                covered = self.meter.wait_until(it.end) if wait else (self.meter.trace.last_time or 0.0) >= it.end
                if not covered:
                    break
                it.energy_j = float(self.meter.trace.between(it.start, it.end))
            self._waiting.pop(0)
            line = {"iteration": it.index, "phase": it.phase, "runs": it.runs, "stage": self.stage,
                    "wall_time": it.wall_time, "time_s": it.time_s, "time": self.time_label,
                    "samples_per_s": it.samples / it.time_s if it.time_s > 0 else None,
                    "energy_j": it.energy_j, "energy": self.energy, "clocks_requested_mhz": it.clocks_requested,
                    "loss": it.loss, "units_timed": it.units_timed, **it.extra}
            self._file.write(json.dumps(line) + "\n")
            self._on_done(it)
        self._file.flush()

    def oldest_unwritten_start(self) -> float | None:
        """The meter's trace must be kept from here on (trimming before it would lose an energy)."""
        return self._waiting[0].start if self._waiting else None

    def close(self) -> None:
        if not self._file.closed:
            self.write_known(wait=True)
            self._file.close()


def job_iterations(
    per_rank: Sequence[Sequence[tuple[str, float, float | None]]],
) -> list[tuple[str, float, float | None]]:
    """The job's steady iterations: what ran, the slowest rank's time, the sum of every GPU's energy."""
    job = []
    for ranks in zip(*per_rank, strict=True):
        energies = [e for _, _, e in ranks]
        job.append((ranks[0][0], max(t for _, t, _ in ranks), None if None in energies else sum(energies)))
    return job


def comparison_pattern(steps: int, pairs: int, runs: str = PLAN) -> list[str]:
    """What each steady iteration runs: the first ``pairs`` pairs interleave ``runs`` (the plan) with the baseline
    in ABBA order (drift within a pair favours neither side), the rest run ``runs``."""
    pattern = []
    for k in range(min(pairs, steps // 2)):
        pattern += [runs, BASELINE] if k % 2 == 0 else [BASELINE, runs]
    return pattern + [runs] * (steps - len(pattern))


Measure = tuple[float, float | None]  # (time, energy) of one iteration


def paired(job: Sequence[tuple[str, float, float | None]], runs: str = PLAN) -> list[tuple[Measure, Measure]]:
    """((``runs``' time, energy), (baseline time, energy)) for each interleaved pair, in order."""
    pairs: list[tuple[Measure, Measure]] = []
    for a, b in zip(job[0::2], job[1::2], strict=False):
        if {a[0], b[0]} == {runs, BASELINE}:
            plan, base = (a, b) if a[0] == runs else (b, a)
            pairs.append(((plan[1], plan[2]), (base[1], base[2])))
    return pairs

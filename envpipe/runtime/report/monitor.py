"""EnvPipe's per-iteration numbers in the monitors the user already watches (DeepSpeed's `MonitorMaster`).

DeepSpeed writes its own events (`Train/Samples/train_loss`, step = the samples trained so far) through
`engine.monitor.write_events` on rank 0, to every backend the config enables: TensorBoard, W&B, CSV, Comet.
EnvPipe adds its events the same way, under `EnvPipe/Samples/...`, with the same step:

    iteration_time_s[_simulated]   the job's iteration (its slowest rank)
    samples_per_s[_simulated]      the job's samples over that time
    energy_j_<kind>                every GPU of the job (kind: measured = NVML counter, simulated = a
    power_w_<kind>                 simulated GPU), and per stage: stage<s>_energy_j_<kind>
    stage<s>_clock_mhz             the stage's mean requested SM clock in that iteration (0: none requested)
    phase                          0 calibrate, 1 profile, 2 reconfigure, 3 steady, 4 warm-up (a new order),
                                   5 rehearse
    runs_plan                      1: the plan ran, 0: 1F1B with every clock at max
    saving_planned_simulated       the planner's predicted energy saving (simulated against simulated)
    saving_<kind>                  the measured saving: plan vs this run's interleaved 1F1B all-max iterations,
                                   the median over the steady comparison pairs so far (from the first pair on)
    plan_kept                      after the comparison pairs: 1 the plan (or its order) runs on, 0 it measured
                                   slower than the budget or dearer, and 1F1B all-max runs
                                   (envpipe.runtime.phases.noharm)
    prediction_trusted             1: the report's predictions held (envpipe.runtime.report.prediction.trust),
                                   0: flagged

A per-stage tag keeps its stage in its last part (`stage1_clock_mhz`, not `stage1/clock_mhz`): DeepSpeed's
CSV monitor names a file's column after that part, so every stage's column says which stage it is.

A job's energy needs every rank's counter, so ranks hand their finished iterations to rank 0 every
`monitor_interval` iterations and whenever the report is written (one gather); rank 0 writes the events of
every iteration all ranks have finished. The energy of an iteration is known once the counter has moved past
its end (NVML: about 100 ms), so the report's flush, which waits for the counter, brings the last ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envpipe.runtime.measure import collective
from envpipe.runtime.measure.iterations import BASELINE, PLAN, Iteration
from envpipe.runtime.report.collect import measured_comparison

PHASES = {"calibrate": 0, "profile": 1, "reconfigure": 2, "steady": 3, "warm-up": 4, "rehearse": 5}
STEADY = "steady"
PREFIX = "EnvPipe/Samples/"


@dataclass(frozen=True)
class Finished:
    """One rank's finished iteration, as rank 0 needs it for the job's events."""

    index: int
    stage: int
    phase: str
    runs: str
    time_s: float
    energy_j: float | None
    samples: int
    global_samples: int
    mean_clock_mhz: float


def phase_code(phase: str) -> int:
    return PHASES[phase.split("@")[0]]


class MonitorFeed:
    """Collects this rank's finished iterations and, on rank 0, writes the job's events."""

    def __init__(self, write_events: Callable[[list[tuple[str, float, int]]], None] | None, energy_kind: str,
                 simulated_time: bool) -> None:
        self._write = write_events  # None: no monitor enabled in the DeepSpeed config
        self.kind = energy_kind  # "measured" or "simulated"
        self._time = "_simulated" if simulated_time else ""
        self._mine: list[Finished] = []
        self._partial: dict[int, list[Finished]] = {}  # rank 0: iterations not every rank has finished
        self.saving_planned: float | None = None
        self._compared: list[tuple[str, float, float | None]] = []  # rank 0: the steady comparison window, as
        self._comparing = True  # the job's iterations (what ran, time, energy); until a pair is not one
        self.plan_kept: bool | None = None
        self.trusted: bool | None = None

    def add(self, it: Iteration, stage: int) -> None:
        clocks = it.clocks_requested
        self._mine.append(Finished(it.index, stage, it.phase, it.runs, it.time_s, it.energy_j, it.samples,
                                   it.global_samples, statistics.fmean(clocks) if clocks else 0.0))

    def flush(self) -> None:
        """Hand the finished iterations to rank 0 and write every complete one (a collective call)."""
        if self._write is None:
            self._mine = []
            return
        everyone = collective.gather(self._mine)
        self._mine = []
        if collective.rank() != 0:
            return
        for rows in everyone:
            for row in rows:
                self._partial.setdefault(row.index, []).append(row)
        events: list[tuple[str, float, int]] = []
        for index in sorted(self._partial):
            rows = self._partial[index]
            if len(rows) < len(everyone):
                continue
            self._compare(rows)
            events += self.events(rows)
            del self._partial[index]
        if events:
            self._write(events)

    def _compare(self, rows: Sequence[Finished]) -> None:
        """Keep a steady iteration of the comparison window: the plan's and 1F1B all-max's iterations come in
        pairs first (steady.py), so the window ends with the first pair that is not one."""
        if not self._comparing or rows[0].phase != STEADY:
            return
        energies = [r.energy_j for r in rows]
        self._compared.append((rows[0].runs, max(r.time_s for r in rows),
                               None if None in energies else sum(e or 0.0 for e in energies)))
        if len(self._compared) % 2 == 0 and {self._compared[-2][0], self._compared[-1][0]} != {PLAN, BASELINE}:
            self._comparing = False
            del self._compared[-2:]

    @property
    def saving_measured(self) -> float | None:
        """The measured saving so far: the median over the comparison pairs, as the report computes it."""
        compared = measured_comparison(self._compared, self.kind)
        return None if compared is None or compared.energy_saving is None else compared.energy_saving.median

    def events(self, rows: Sequence[Finished]) -> list[tuple[str, float, int]]:
        """The job's events of one iteration from every rank's row."""
        first = rows[0]
        step = first.global_samples
        time_s = max(r.time_s for r in rows)
        out: list[tuple[str, Any, int]] = [
            (f"{PREFIX}iteration_time_s{self._time}", time_s, step),
            (f"{PREFIX}samples_per_s{self._time}", first.samples / time_s if time_s > 0 else 0.0, step),
            (f"{PREFIX}phase", phase_code(first.phase), step),
            (f"{PREFIX}runs_plan", int(first.runs == PLAN), step),
        ]
        if all(r.energy_j is not None for r in rows):
            total = sum(r.energy_j or 0.0 for r in rows)
            out += [(f"{PREFIX}energy_j_{self.kind}", total, step),
                    (f"{PREFIX}power_w_{self.kind}", total / time_s if time_s > 0 else 0.0, step)]
            for s in sorted({r.stage for r in rows}):
                out.append((f"{PREFIX}stage{s}_energy_j_{self.kind}",
                            sum(r.energy_j or 0.0 for r in rows if r.stage == s), step))
        for s in sorted({r.stage for r in rows}):
            out.append((f"{PREFIX}stage{s}_clock_mhz",
                        statistics.fmean(r.mean_clock_mhz for r in rows if r.stage == s), step))
        if self.saving_planned is not None:
            out.append((f"{PREFIX}saving_planned_simulated", self.saving_planned, step))
        saving = self.saving_measured
        if saving is not None:
            out.append((f"{PREFIX}saving_{self.kind}", saving, step))
        for name, flag in (("plan_kept", self.plan_kept), ("prediction_trusted", self.trusted)):
            if flag is not None:
                out.append((f"{PREFIX}{name}", int(flag), step))
        return out

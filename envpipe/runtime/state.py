"""What EnvPipe decided, in a DeepSpeed checkpoint: `envpipe_state.json` in the checkpoint's tag folder.

`engine.save_checkpoint` writes it (rank 0; every rank holds the same decision) into the tag's folder
*before* DeepSpeed saves the checkpoint and names the tag in `latest`, so a crash at any moment leaves no tag
that `latest` names without its state. `engine.load_checkpoint` reads it on rank 0 and broadcasts it. A job
resumed from it goes straight to the steady plan (no calibration, profiling or re-planning) — unless it is
unusable: then one line says why, and the phases start again.

The file is one typed, bounded document, `RunState` (pydantic, strict: no unknown or missing field, no
string for a number). It is read like every other input (envpipe.limits): a regular file of at most
MAX_STATE_BYTES (a FIFO is refused unopened-for-reading, /dev/zero unread), JSON with finite numbers only and
integers of at most 18 digits, nested at most MAX_STATE_DEPTH deep. Then every number is in its range (times,
powers, energies, clocks, counts; and nothing the document holds beyond MAX_STATE_NUMBER in magnitude), the
enums are known (`origin`), every per-stage list has the job's stages, every per-rank list its processes,
the profile is a rectangle of distinct clocks, the straggler is one of the replicas, and there is one plan per
replica, for the job's stages and micro-batches, in an order DeepSpeed's engine runs. Last, the saved job's
shape (processes, stages, replicas, micro-batches and their size, each stage's model) must be this job's.

To add a field: give it a default (None) so that states saved before it still load, and bound it like the
others; STATE_VERSION changes only when a field's meaning does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import ConfigDict, Field, PlainSerializer, PlainValidator, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from envpipe import limits
from envpipe.atomicfile import atomic_write
from envpipe.limits import (
    MAX_CLOCK_MHZ,
    MAX_CLOCKS,
    MAX_JSON_DEPTH,
    MAX_MICROBATCHES,
    MAX_POWER_W,
    MAX_STAGES,
    MAX_UNIT_ENERGY_J,
    MAX_UNIT_TIME_S,
)
from envpipe.plan.planfile import Plan
from envpipe.profile import Profile
from envpipe.profile.from_measured import StageUnits
from envpipe.runtime import summary as S
from envpipe.runtime.decision import CalibrationResult, Decided, Decision, Origin, plan_digest
from envpipe.runtime.measure.replicas import StageStats
from envpipe.runtime.measure.timing import SimInputs

STATE_FILE = "envpipe_state.json"
STATE_VERSION = 1
MAX_STATE_BYTES = 64 * 2**20  # a state holds one plan per replica; the largest plan is about 8 MiB
MAX_STATE_DEPTH = MAX_JSON_DEPTH + 2  # a plan, two levels down (a real state nests 6 deep)
MAX_STATE_NUMBER = 1e15  # no number a run writes comes near it (bytes, joules, seconds); -1e308 does
MAX_PROCESSES = 2**20
MAX_MICRO_BATCH = 2**24
MAX_PAIRS = 10**9  # steady comparison pairs: a pair is two iterations
_STRICT = ConfigDict(strict=True, extra="forbid")

Count = Annotated[int, Field(ge=1)]
Seconds = Annotated[float, Field(ge=0, le=MAX_UNIT_TIME_S)]
Watts = Annotated[float, Field(ge=0, le=MAX_POWER_W)]
Joules = Annotated[float, Field(ge=0, le=MAX_UNIT_ENERGY_J)]
Mhz = Annotated[int, Field(ge=1, le=MAX_CLOCK_MHZ)]
Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]


def _plan(value: Any) -> Plan:
    return value if isinstance(value, Plan) else Plan.from_json(value)  # PlanError is a ValueError: one line


# a replica's plan: the plan file's JSON in the document, a Plan once read (envpipe.plan.planfile's checks)
SavedPlan = Annotated[Plan, PlainValidator(_plan), PlainSerializer(Plan.to_json, return_type=dict)]


@dataclass(frozen=True, config=_STRICT)
class JobShape:
    """What a decision is only valid for."""

    processes: Annotated[int, Field(ge=1, le=MAX_PROCESSES)]
    stages: Annotated[int, Field(ge=1, le=MAX_STAGES)]
    replicas: Annotated[int, Field(ge=1, le=MAX_PROCESSES)]
    microbatches: Annotated[int, Field(ge=1, le=MAX_MICROBATCHES)]
    micro_batch_size: Annotated[int, Field(ge=1, le=MAX_MICRO_BATCH)]
    models: list[Digest]  # per stage: digest of its parameters' names, shapes and dtypes

    @model_validator(mode="after")
    def _per_stage(self) -> JobShape:
        _length("models", self.models, self.stages, "stages")
        return self

    def differences(self, other: JobShape) -> list[str]:
        """What changed from ``other`` to this one, in words (empty: the same job)."""
        out = [f"{name} {getattr(other, name)} -> {getattr(self, name)}" for name in
               ("processes", "stages", "replicas", "microbatches", "micro_batch_size")
               if getattr(self, name) != getattr(other, name)]
        if not out and self.models != other.models:
            changed = [s for s, (a, b) in enumerate(zip(other.models, self.models, strict=True)) if a != b]
            out.append(f"the model's parameters on stage(s) {changed}")
        return out


@dataclass(frozen=True, config=_STRICT)
class SavedTiming:
    """envpipe.runtime.measure.timing.SimInputs: the simulator's inputs, per stage and for the job."""

    fwd_s: list[Seconds]
    bwd_s: list[Seconds]
    gap_s: list[Seconds]
    transfer_s: Seconds
    tail_s: list[Seconds]
    head_s: Annotated[float, Field(ge=-MAX_UNIT_TIME_S, le=MAX_UNIT_TIME_S)]  # a median of noisy differences


@dataclass(frozen=True, config=_STRICT)
class UnitEnergies:
    """A stage's slowest replica in calibration: its unit times (s) and energies (J; None: not measured)."""

    F: Seconds
    B: Seconds
    F_j: Joules | None
    B_j: Joules | None
    gap_s: Seconds | None = None
    tail_s: Seconds | None = None


@dataclass(frozen=True, config=_STRICT)
class SavedProfile:
    """The profile the planner planned on: per stage (rows), per clock (columns, distinct, highest first)."""

    freqs: Annotated[list[Mhz], Field(min_length=1, max_length=MAX_CLOCKS)]
    fwd_time: list[list[Seconds]]
    bwd_time: list[list[Seconds]]
    fwd_energy: list[list[Joules]]
    bwd_energy: list[list[Joules]]
    source: str

    @model_validator(mode="after")
    def _rectangle(self) -> SavedProfile:
        if self.freqs != sorted(set(self.freqs), reverse=True):
            raise ValueError("freqs must be distinct clocks, highest first")
        for name in ("fwd_time", "bwd_time", "fwd_energy", "bwd_energy"):
            rows = getattr(self, name)
            if not rows or any(len(row) != len(self.freqs) for row in rows) or len(rows) != len(self.fwd_time):
                raise ValueError(f"{name} must have one row per stage of one value per clock ({len(self.freqs)})")
        return self


@dataclass(frozen=True, config=_STRICT)
class RunState:
    version: int
    shape: JobShape
    calibration: SavedTiming
    calibration_report: S.Calibration
    memory: list[S.MemoryUse]
    unit_energies: list[UnitEnergies]
    straggler: Annotated[int, Field(ge=0)] | None  # a replica slower than the others (calibration)
    idle_power_w: Watts | None
    blocking_power_w: list[Watts] | None
    tail_power_w: list[Watts] | None
    origin: Origin
    plans: dict[str, SavedPlan]  # per replica ("0", "1", ...)
    info: S.PlanInfo
    predicted: S.PredictedComparison | None
    predicted_time_s: Annotated[float, Field(gt=0, le=MAX_UNIT_TIME_S)] | None
    profile: SavedProfile | None
    straggler_rule: S.StragglerRule | None
    reconfiguration: S.Reconfiguration | None
    pairs_done: Annotated[int, Field(ge=0, le=MAX_PAIRS)]  # steady comparison pairs already measured
    waiting_power_w: list[Watts | None] | None = None  # per rank (absent from states saved before 2026-11-28)
    verdict: S.Verdict | None = None  # what the steady phase's pairs kept (envpipe.runtime.phases.noharm), once judged

    @model_validator(mode="after")
    def _for_its_job(self) -> RunState:
        """Every part is for the job the document names (its shape is compared with this job's in `load`)."""
        job = self.shape
        stages = job.stages
        timing = self.calibration
        for name in ("fwd_s", "bwd_s", "gap_s", "tail_s"):
            _length(f"calibration.{name}", getattr(timing, name), stages, "stages")
        report = self.calibration_report
        for name in ("fwd_s", "bwd_s", "gap_s", "tail_s", "effective_clock_mhz", "blocking_power_w", "tail_power_w"):
            _length(f"calibration_report.{name}", getattr(report, name), stages, "stages")
        for name in ("memory", "unit_energies", "blocking_power_w", "tail_power_w"):
            _length(name, getattr(self, name), stages, "stages")
        _length("waiting_power_w", self.waiting_power_w, job.processes, "processes")
        _length("info.orders", self.info.orders, stages, "stages")
        if any(v < 0 for m in self.memory for v in dataclasses.astuple(m) if v is not None):
            raise ValueError("memory: byte and micro-batch counts must be >= 0")
        if self.straggler is not None and self.straggler >= job.replicas:
            raise ValueError(f"straggler: replica {self.straggler} of a job with {job.replicas} replica(s)")
        if self.profile is not None:
            _length("profile.fwd_time", self.profile.fwd_time, stages, "stages")
        if sorted(self.plans, key=lambda k: (len(k), k)) != [str(d) for d in range(job.replicas)]:
            raise ValueError(f"plans: one per replica, keys 0..{job.replicas - 1}")
        for replica, plan in self.plans.items():
            why = plan.pipeline_error(stages, job.microbatches)
            if why:
                raise ValueError(f"plans.{replica}: {why}")
        if self.info.digest != plan_digest(self.plans["0"]):
            raise ValueError("info.digest is not replica 0's plan")
        return self


def _length(name: str, values: list[Any] | None, want: int, what: str) -> None:
    if values is not None and len(values) != want:
        raise ValueError(f"{name}: {len(values)} entries for {want} {what}")


_ADAPTER: TypeAdapter[RunState] = TypeAdapter(RunState)


def model_digest(named_parameters: Any) -> str:
    """A stage's parameter names, shapes and dtypes, hashed: equal digests, the same model stage."""
    text = json.dumps([[name, list(p.shape), str(p.dtype)] for name, p in named_parameters])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def to_state(shape: JobShape, decided: Decided, pairs_done: int, verdict: S.Verdict | None = None) -> RunState:
    decision = decided.decision
    profile = decision.profile
    saved = None if profile is None else SavedProfile(
        [int(f) for f in profile.freqs], _rows(profile.fwd_time), _rows(profile.bwd_time), _rows(profile.fwd_energy),
        _rows(profile.bwd_energy), profile.source)
    c = decided.calibrated
    return RunState(  # by name: a number out of bounds is named in the line that says so (`write`)
        version=STATE_VERSION, shape=shape, calibration=SavedTiming(**dataclasses.asdict(c.timing)),
        calibration_report=c.report, memory=c.memory, unit_energies=[_unit_energies(row) for row in c.unit_energies],
        straggler=c.straggler, idle_power_w=c.idle_power_w, blocking_power_w=c.blocking_power_w,
        tail_power_w=c.tail_power_w, origin=decision.origin, plans={str(d): p for d, p in decision.plans.items()},
        info=decision.info, predicted=decision.predicted, predicted_time_s=decision.predicted_time_s, profile=saved,
        straggler_rule=decision.straggler_rule, reconfiguration=decided.reconfiguration, pairs_done=pairs_done,
        waiting_power_w=c.waiting_power_w, verdict=verdict)


def from_state(state: RunState) -> Decided:
    energies = [_stage_stats(row) for row in state.unit_energies]
    calibrated = CalibrationResult(SimInputs(**dataclasses.asdict(state.calibration)), state.calibration_report,
                            list(state.memory), energies, state.straggler, state.idle_power_w, state.blocking_power_w,
                            state.tail_power_w, state.waiting_power_w)
    p = state.profile
    profile = None if p is None else Profile(np.asarray(p.freqs), np.asarray(p.fwd_time, float),
                                             np.asarray(p.bwd_time, float), np.asarray(p.fwd_energy, float),
                                             np.asarray(p.bwd_energy, float), p.source)
    info = state.info
    decision = Decision(state.origin, info.source, info.policy, info.order,
                        {int(d): plan for d, plan in state.plans.items()}, info.deployed, info.budget_s,
                        tuple(info.memory or ()), tuple(info.refused_orders), state.predicted, state.predicted_time_s,
                        profile, state.straggler_rule)
    return Decided(calibrated, decision, state.reconfiguration)


def _unit_energies(stats: StageStats) -> UnitEnergies:
    u = stats.units
    return UnitEnergies(u.fwd_s, u.bwd_s, _known(u.fwd_j), _known(u.bwd_j), _known(stats.gap_s), _known(stats.tail_s))


def _stage_stats(row: UnitEnergies) -> StageStats:
    def number(value: float | None) -> float:
        return math.nan if value is None else value

    return StageStats(StageUnits(row.F, row.B, number(row.F_j), number(row.B_j)), number(row.gap_s),
                      number(row.tail_s))


def _known(value: float) -> float | None:
    """A number for the document: None where the run has none (nan)."""
    return None if math.isnan(value) else float(value)


def _rows(table: Any) -> list[list[float]]:
    return [[float(x) for x in row] for row in np.asarray(table, float)]


def document(state: RunState) -> dict[str, Any]:
    """The state as the file holds it (JSON types)."""
    return _ADAPTER.dump_python(state, mode="json")  # type: ignore[no-any-return]


def save(folder: Path, state: RunState) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / STATE_FILE) as fh:
        json.dump(document(state), fh, allow_nan=False)


def write(folder: Path, shape: JobShape, decided: Decided, pairs_done: int, verdict: S.Verdict | None = None
          ) -> str | None:
    """Save what was decided into a checkpoint's folder; None, or why it was not saved (one line: a number of
    the run outside the document's bounds; the checkpoint goes on without it, and a resume profiles again)."""
    try:
        save(folder, to_state(shape, decided, pairs_done, verdict))
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        return f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
    return None


def load(folder: Path, job: JobShape) -> RunState | str:
    """The state in a checkpoint folder for this `job`, or why there is none usable (one line)."""
    path = folder / STATE_FILE
    try:
        text = limits.read_text(path, MAX_STATE_BYTES, "EnvPipe state")
        data = limits.parse_json(text, MAX_STATE_DEPTH)
    except FileNotFoundError:
        return f"checkpoint {folder} has no EnvPipe state ({STATE_FILE})"
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror or exc})"
    except ValueError as exc:
        return f"{path}: {exc}"
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return f"{path}: not a version {STATE_VERSION} EnvPipe state"
    if limits.json_depth(data) > MAX_STATE_DEPTH:
        return f"{path}: nested deeper than {MAX_STATE_DEPTH} levels"
    if (big := _too_large(data)) is not None:
        return f"{path}: {big}: a number beyond {MAX_STATE_NUMBER:g} in magnitude"
    try:
        found = _ADAPTER.validate_json(text)  # JSON mode: strict types, objects as dataclasses
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(x) for x in err["loc"])
        return f"{path}: {where + ': ' if where else ''}{err['msg'].removeprefix('Value error, ')}"
    diffs = job.differences(found.shape)
    if diffs:
        return f"the job changed since checkpoint {folder} ({'; '.join(diffs)})"
    return found


def _too_large(value: Any, where: str = "") -> str | None:
    """Where the document holds a number beyond MAX_STATE_NUMBER in magnitude, or None."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        return where or "the state" if is_number and abs(value) > MAX_STATE_NUMBER else None
    return next((found for k, v in items if (found := _too_large(v, f"{where}.{k}".lstrip("."))) is not None), None)

"""What EnvPipe decided, in a DeepSpeed checkpoint: `envpipe_state.json` in the checkpoint's tag folder.

`engine.save_checkpoint` writes it beside DeepSpeed's files (rank 0; every rank holds the same decision);
`engine.load_checkpoint` reads it on rank 0 and broadcasts it. A job resumed from it goes straight to the
steady plan (no calibration, profiling or re-planning) — unless the job's shape (processes, stages,
replicas, micro-batches and their size) or its model (each stage's parameter names, shapes and dtypes)
changed, or the checkpoint has no EnvPipe state: then one line says why, and the phases start again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from envpipe.atomicfile import atomic_write
from envpipe.plan.planfile import Plan
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.calibrate import Calibrated
from envpipe.runtime.decide import Decided, Decision, Origin
from envpipe.runtime.timing import Calibration

STATE_FILE = "envpipe_state.json"
STATE_VERSION = 1
_STRICT = ConfigDict(strict=True, extra="forbid")


@dataclass(frozen=True, config=_STRICT)
class JobShape:
    """What a decision is only valid for."""

    processes: int
    stages: int
    replicas: int
    microbatches: int
    micro_batch_size: int
    models: list[str]  # per stage: digest of its parameters' names, shapes and dtypes

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
class SavedProfile:
    freqs: list[int]
    fwd_time: list[list[float]]
    bwd_time: list[list[float]]
    fwd_energy: list[list[float]]
    bwd_energy: list[list[float]]
    source: str


@dataclass(frozen=True, config=_STRICT)
class RunState:
    version: int
    shape: JobShape
    calibration: dict[str, Any]  # envpipe.runtime.timing.Calibration's fields
    calibration_report: S.Calibration
    memory: list[S.MemoryUse]
    unit_energies: list[dict[str, float]]
    straggler: int | None
    idle_power_w: float | None
    blocking_power_w: list[float] | None
    tail_power_w: list[float] | None
    origin: str
    plans: dict[str, dict[str, Any]]  # per replica: the plan file's JSON
    info: S.PlanInfo
    predicted: S.PredictedComparison | None
    predicted_time_s: float | None
    profile: SavedProfile | None
    straggler_rule: S.StragglerRule | None
    reconfiguration: S.Reconfiguration | None
    pairs_done: int  # steady comparison pairs already measured
    waiting_power_w: list[float | None] | None = None  # per rank (absent from states saved before 2026-11-28)


_ADAPTER: TypeAdapter[RunState] = TypeAdapter(RunState)


def model_digest(named_parameters: Any) -> str:
    """A stage's parameter names, shapes and dtypes, hashed: equal digests, the same model stage."""
    text = json.dumps([[name, list(p.shape), str(p.dtype)] for name, p in named_parameters])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def to_state(shape: JobShape, decided: Decided, pairs_done: int) -> RunState:
    decision = decided.decision
    profile = decision.profile
    saved = None if profile is None else SavedProfile(
        [int(f) for f in profile.freqs], _rows(profile.fwd_time), _rows(profile.bwd_time), _rows(profile.fwd_energy),
        _rows(profile.bwd_energy), profile.source)
    c = decided.calibrated
    return RunState(STATE_VERSION, shape, dataclasses.asdict(c.timing), c.report, c.memory,
                    [{k: float(v) for k, v in row.items()} for row in c.unit_energies], c.straggler, c.idle_power_w,
                    c.blocking_power_w, c.tail_power_w, decision.origin.value,
                    {str(d): p.to_json() for d, p in decision.plans.items()}, decision.info, decision.predicted,
                    decision.predicted_time_s, saved, decision.straggler_rule, decided.reconfiguration, pairs_done,
                    c.waiting_power_w)


def from_state(state: RunState) -> Decided:
    calibrated = Calibrated(Calibration(**state.calibration), state.calibration_report, list(state.memory),
                            [dict(row) for row in state.unit_energies], state.straggler, state.idle_power_w,
                            state.blocking_power_w, state.tail_power_w, state.waiting_power_w)
    p = state.profile
    profile = None if p is None else Profile(np.asarray(p.freqs), np.asarray(p.fwd_time, float),
                                             np.asarray(p.bwd_time, float), np.asarray(p.fwd_energy, float),
                                             np.asarray(p.bwd_energy, float), p.source)
    info = state.info
    decision = Decision(Origin(state.origin), info.source, info.policy, info.order,
                        {int(d): Plan.from_json(j) for d, j in state.plans.items()}, info.deployed, info.budget_s,
                        tuple(info.memory or ()), tuple(info.refused_orders), state.predicted, state.predicted_time_s,
                        profile, state.straggler_rule)
    return Decided(calibrated, decision, state.reconfiguration)


def _rows(table: Any) -> list[list[float]]:
    return [[float(x) for x in row] for row in np.asarray(table, float)]


def save(folder: Path, state: RunState) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / STATE_FILE) as fh:
        json.dump(_ADAPTER.dump_python(state, mode="json"), fh)


def load(folder: Path) -> RunState | str:
    """The state in a checkpoint folder, or why there is none usable (one line)."""
    path = folder / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return f"checkpoint {folder} has no EnvPipe state ({STATE_FILE})"
    except (OSError, ValueError) as exc:
        return f"{path}: cannot read ({exc})"
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return f"{path}: not a version {STATE_VERSION} EnvPipe state"
    try:
        return _ADAPTER.validate_json(json.dumps(data))  # JSON mode: strict types, objects as dataclasses
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        return f"{path}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}"

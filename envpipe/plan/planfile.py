"""The plan JSON (DESIGN.md, version 1) and evaluating any plan against a profile.

{"version": 1, "num_stages": S, "num_microbatches": M, "schedule": "...", "policy": "...",
 "stages": [[{"kind": "F", "mb": 0, "freq_mhz": 1410}, ...], ...],
 "predicted": {"iteration_time_s": T, "energy_j": E, "baseline_time_s": T0, "baseline_energy_j": E0},
 "critical_path": [[stage, "F", mb], ...]}

Optional, still version 1: "predicted" may hold "peak_memory_bytes": [per stage] (activation bytes at the
stage's peak, written when the plan was made with a memory model); readers that do not know it skip it.
A schedule with several model chunks per stage (interleaved 1F1B, DualPipeV) adds "chunks": v at the top,
"chunk": k to every unit and a fourth entry, the chunk, to every critical-path unit; plans with one chunk
per stage have none of these, as before.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envpipe.plan.dag import PipelineDag, ScheduleError
from envpipe.plan.layout import StageLayout, model_profile
from envpipe.plan.schedules import CHUNKED, ChunkUnit, Unit, build_schedule, one_f_one_b, schedule_layout
from envpipe.plan.simulate import Timeline, simulate
from envpipe.profile import Profile

PLAN_VERSION = 1
_TOP_KEYS = {"version", "num_stages", "num_microbatches", "schedule", "policy", "stages", "predicted",
             "critical_path", "chunks"}
_PREDICTED_KEYS = ("iteration_time_s", "energy_j", "baseline_time_s", "baseline_energy_j")
_PEAK_MEMORY = "peak_memory_bytes"  # optional per-stage list inside "predicted"


class PlanError(ValueError):
    """A plan file is malformed or does not fit the profile it is evaluated with."""


@dataclass(frozen=True)
class PlannedUnit:
    kind: str
    mb: int
    freq_mhz: int
    chunk: int = 0  # which of its stage's model chunks (interleaved 1F1B, DualPipeV)


@dataclass
class Plan:
    num_stages: int
    num_microbatches: int
    schedule: str
    policy: str
    stages: list[list[PlannedUnit]]
    predicted: dict[str, float] = field(default_factory=dict)
    # [stage, kind, mb] per unit, and the chunk as a fourth entry when a stage runs several
    critical_path: list[tuple[int, str, int] | tuple[int, str, int, int]] = field(default_factory=list)
    peak_memory_bytes: list[int] | None = None  # per stage, when planned with a memory model
    chunks: int = 1  # model chunks per stage

    def orders(self) -> list[list[Unit]]:
        """Per-stage (kind, mb) orders of a plan with one chunk per stage (what the runtime runs)."""
        if self.chunks != 1:
            raise PlanError(f"a {self.schedule} plan runs {self.chunks} chunks per stage: use chunk_orders()")
        return [[(u.kind, u.mb) for u in units] for units in self.stages]

    def chunk_orders(self) -> list[list[ChunkUnit]]:
        return [[(u.kind, u.mb, u.chunk) for u in units] for units in self.stages]

    def layout(self) -> StageLayout:
        try:
            return schedule_layout(self.schedule, self.num_stages, self.chunks)
        except ValueError as exc:
            raise PlanError(str(exc)) from None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "schedule": self.schedule,
            "policy": self.policy,
            **({} if self.chunks == 1 else {"chunks": self.chunks}),
            "stages": [[{"kind": u.kind, "mb": u.mb, "freq_mhz": u.freq_mhz,
                         **({} if self.chunks == 1 else {"chunk": u.chunk})} for u in units]
                       for units in self.stages],
            "predicted": {**self.predicted,
                          **({} if self.peak_memory_bytes is None else {_PEAK_MEMORY: list(self.peak_memory_bytes)})},
            "critical_path": [list(p) for p in self.critical_path],
        }

    def save(self, path: str | Path) -> None:
        """Write atomically, so an interrupted write never leaves a corrupt plan behind."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_json(), fh, indent=1)
                fh.write("\n")
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise PlanError(f"{path}: cannot read: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{path}: not JSON: {exc}") from None
        try:
            return cls.from_json(data)
        except PlanError as exc:
            raise PlanError(f"{path}: {exc}") from None

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        if not isinstance(data, dict):
            raise PlanError("a plan is a JSON object")
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise PlanError(f"unknown key(s): {', '.join(sorted(unknown))}")
        if data.get("version") != PLAN_VERSION:
            raise PlanError(f"unsupported plan version {data.get('version')!r} (this tool reads {PLAN_VERSION})")
        S, M = _positive_int(data, "num_stages"), _positive_int(data, "num_microbatches")
        chunks = _positive_int(data, "chunks") if "chunks" in data else 1
        stages_raw = data.get("stages")
        if not isinstance(stages_raw, list) or len(stages_raw) != S:
            raise PlanError(f"'stages' must be a list of {S} stage lists")
        stages = [[_unit(s, i, u, chunks) for i, u in enumerate(units)] if isinstance(units, list)
                  else _fail(f"stage {s} is not a list") for s, units in enumerate(stages_raw)]
        predicted = data.get("predicted", {})
        peak = _peak_memory(predicted, S)
        if isinstance(predicted, dict):
            predicted = {k: v for k, v in predicted.items() if k != _PEAK_MEMORY}
        if not isinstance(predicted, dict) or any(
            not isinstance(v, int | float) or isinstance(v, bool) for v in predicted.values()):
            raise PlanError("'predicted' must map names to numbers")
        path = data.get("critical_path", [])
        width = 3 if chunks == 1 else 4
        if not isinstance(path, list) or any(
            not (isinstance(p, list) and len(p) == width and isinstance(p[0], int) and p[1] in ("F", "B")
                 and all(isinstance(x, int) for x in p[2:])) for p in path):
            entry = "[stage, 'F'|'B', mb" + (", chunk]" if chunks > 1 else "]")
            raise PlanError(f"'critical_path' must be a list of {entry}")
        for key in ("schedule", "policy"):
            if not isinstance(data.get(key), str):
                raise PlanError(f"'{key}' must be a string")
        return cls(S, M, data["schedule"], data["policy"], stages, {k: float(v) for k, v in predicted.items()},
                   [(p[0], p[1], p[2]) if chunks == 1 else (p[0], p[1], p[2], p[3]) for p in path], peak, chunks)


def _peak_memory(predicted: Any, num_stages: int) -> list[int] | None:
    if not isinstance(predicted, dict) or _PEAK_MEMORY not in predicted:
        return None
    peak = predicted[_PEAK_MEMORY]
    if not isinstance(peak, list) or len(peak) != num_stages or any(
            not isinstance(b, int) or isinstance(b, bool) or b < 0 for b in peak):
        raise PlanError(f"'predicted.{_PEAK_MEMORY}' must be a list of {num_stages} whole numbers >= 0")
    return list(peak)


def _fail(message: str) -> list[PlannedUnit]:
    raise PlanError(message)


def _positive_int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"'{key}' must be a positive integer, got {value!r}")
    return value


def _unit(stage: int, pos: int, raw: Any, chunks: int) -> PlannedUnit:
    where = f"stage {stage} unit {pos}"
    keys = {"kind", "mb", "freq_mhz"} | ({"chunk"} if chunks > 1 else set())
    if not isinstance(raw, dict) or set(raw) != keys:
        raise PlanError(f"{where}: must be {{{', '.join(repr(k) for k in sorted(keys))}}}, got {raw!r}")
    kind, mb, freq, chunk = raw["kind"], raw["mb"], raw["freq_mhz"], raw.get("chunk", 0)
    if kind not in ("F", "B"):
        raise PlanError(f"{where}: kind must be 'F' or 'B', got {kind!r}")
    for name, value in (("mb", mb), ("freq_mhz", freq), ("chunk", chunk)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PlanError(f"{where}: {name} must be a non-negative integer, got {value!r}")
    return PlannedUnit(kind, mb, freq, chunk)


def unit_costs(dag: PipelineDag, profile: Profile, freq_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit duration and energy for per-unit clock indices into ``profile.freqs`` (``profile``: one row
    per model stage of the DAG)."""
    s = dag.model_stage
    dur = np.where(dag.is_fwd, profile.fwd_time[s, freq_idx], profile.bwd_time[s, freq_idx])
    en = np.where(dag.is_fwd, profile.fwd_energy[s, freq_idx], profile.bwd_energy[s, freq_idx])
    return dur, en


def evaluate_plan(plan: Plan, profile: Profile, idle_power_w: float, transfer_s: float = 0.0,
                  tail_s: float | np.ndarray = 0.0) -> Timeline:
    """Re-simulate any plan (also one written by hand) on a profile; clear errors if they do not fit.
    A plan with several chunks per stage takes a profile per model stage or per stage (split evenly)."""
    layout = plan.layout()
    if profile.num_stages not in (plan.num_stages, layout.num_model_stages):
        raise PlanError(f"plan has {plan.num_stages} stages but the profile has {profile.num_stages}")
    try:
        dag = PipelineDag.from_orders(plan.chunk_orders() if plan.chunks > 1 else plan.orders(),
                                      plan.num_microbatches, layout)
    except ScheduleError as exc:
        raise PlanError(f"inconsistent plan: {exc}") from None
    clock_index = {int(f): k for k, f in enumerate(profile.freqs)}
    freq_idx = np.empty(dag.num_units, int)
    for s, units in enumerate(plan.stages):
        for u in units:
            if u.freq_mhz not in clock_index:
                raise PlanError(f"stage {s} {u.kind}{u.mb}: {u.freq_mhz} MHz is not a clock of the profile "
                                f"({profile.freqs[-1]}..{profile.freqs[0]} MHz)")
            freq_idx[dag.index(s, u.kind, u.mb, u.chunk)] = clock_index[u.freq_mhz]
    dur, en = unit_costs(dag, model_profile(profile, layout), freq_idx)
    return simulate(dag, dur, en, idle_power_w, transfer_s, tail_s=tail_s)


def baseline_timeline(profile: Profile, num_microbatches: int, idle_power_w: float,
                      transfer_s: float = 0.0, tail_s: float | np.ndarray = 0.0,
                      layout: StageLayout | None = None) -> Timeline:
    """DESIGN's baseline: 1F1B with every unit at the profile's highest clock. For a schedule with several
    chunks per stage (``layout``; ``profile`` per stage or per model stage), that schedule at the highest
    clock instead: the model is cut differently, so 1F1B would not be the same job."""
    if layout is None or layout.chunks == 1:
        S = profile.num_stages if layout is None else layout.num_stages
        dag = PipelineDag.from_orders(one_f_one_b(S, num_microbatches), num_microbatches)
    else:
        name = next(n for n in CHUNKED if schedule_layout(n, layout.num_stages, layout.chunks) == layout)
        orders = build_schedule(name, layout.num_stages, num_microbatches, chunks=layout.chunks)
        dag = PipelineDag.from_orders(orders, num_microbatches, layout)
    dur, en = unit_costs(dag, model_profile(profile, layout or StageLayout.single(dag.num_stages)),
                         np.zeros(dag.num_units, int))
    return simulate(dag, dur, en, idle_power_w, transfer_s, tail_s=tail_s)


def plan_from_timeline(timeline: Timeline, freqs_mhz: np.ndarray, schedule: str, policy: str,
                       baseline: Timeline, peak_memory_bytes: list[int] | None = None) -> Plan:
    """Freeze a simulated assignment (per-unit clocks in MHz) into a Plan with its predictions (and the
    per-stage peak activation bytes when a memory model was given)."""
    dag = timeline.dag
    stages = [[PlannedUnit(*dag.unit(i)[1:], int(freqs_mhz[i]), int(dag.chunk[i])) for i in ids] for ids in dag.order]
    predicted = {
        "iteration_time_s": timeline.iteration_time,
        "energy_j": timeline.energy,
        "baseline_time_s": baseline.iteration_time,
        "baseline_energy_j": baseline.energy,
    }
    assert set(predicted) == set(_PREDICTED_KEYS)
    path = [dag.unit(i) if dag.num_chunks == 1 else (*dag.unit(i), int(dag.chunk[i])) for i in timeline.critical_path()]
    return Plan(dag.num_stages, dag.num_microbatches, schedule, policy, stages, predicted, path, peak_memory_bytes,
                dag.num_chunks)

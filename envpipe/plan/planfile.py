"""The plan JSON (DESIGN.md, version 1) and evaluating any plan against a profile.

{"version": 1, "num_stages": S, "num_microbatches": M, "schedule": "...", "policy": "...",
 "stages": [[{"kind": "F", "mb": 0, "freq_mhz": 1410}, ...], ...],
 "predicted": {"iteration_time_s": T, "energy_j": E, "baseline_time_s": T0, "baseline_energy_j": E0},
 "critical_path": [[stage, "F", mb], ...]}
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from envpipe.plan.dag import PipelineDag, ScheduleError
from envpipe.plan.schedules import Unit, one_f_one_b
from envpipe.plan.simulate import Timeline, simulate
from envpipe.profile import Profile

PLAN_VERSION = 1
_TOP_KEYS = {"version", "num_stages", "num_microbatches", "schedule", "policy", "stages", "predicted",
             "critical_path"}
_PREDICTED_KEYS = ("iteration_time_s", "energy_j", "baseline_time_s", "baseline_energy_j")


class PlanError(ValueError):
    """A plan file is malformed or does not fit the profile it is evaluated with."""


@dataclass(frozen=True)
class PlannedUnit:
    kind: str
    mb: int
    freq_mhz: int


@dataclass
class Plan:
    num_stages: int
    num_microbatches: int
    schedule: str
    policy: str
    stages: list[list[PlannedUnit]]
    predicted: dict[str, float] = field(default_factory=dict)
    critical_path: list[tuple[int, str, int]] = field(default_factory=list)

    def orders(self) -> list[list[Unit]]:
        return [[(u.kind, u.mb) for u in units] for units in self.stages]

    def clocks(self) -> list[list[int]]:
        """Per stage, the planned SM clock (MHz) of each unit in execution order."""
        return [[u.freq_mhz for u in units] for units in self.stages]

    def with_clocks(self, clocks: list[list[int]], predicted: dict[str, float] | None = None) -> Plan:
        """The same order with other clocks (and, if given, other predictions)."""
        stages = [[PlannedUnit(u.kind, u.mb, f) for u, f in zip(units, cs, strict=True)]
                  for units, cs in zip(self.stages, clocks, strict=True)]
        return replace(self, stages=stages, predicted=dict(self.predicted if predicted is None else predicted))

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "schedule": self.schedule,
            "policy": self.policy,
            "stages": [[{"kind": u.kind, "mb": u.mb, "freq_mhz": u.freq_mhz} for u in units]
                       for units in self.stages],
            "predicted": dict(self.predicted),
            "critical_path": [[s, k, m] for s, k, m in self.critical_path],
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
        stages_raw = data.get("stages")
        if not isinstance(stages_raw, list) or len(stages_raw) != S:
            raise PlanError(f"'stages' must be a list of {S} stage lists")
        stages = [[_unit(s, i, u) for i, u in enumerate(units)] if isinstance(units, list)
                  else _fail(f"stage {s} is not a list") for s, units in enumerate(stages_raw)]
        predicted = data.get("predicted", {})
        if not isinstance(predicted, dict) or any(
            not isinstance(v, int | float) or isinstance(v, bool) for v in predicted.values()):
            raise PlanError("'predicted' must map names to numbers")
        path = data.get("critical_path", [])
        if not isinstance(path, list) or any(
            not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], int) and p[1] in ("F", "B")
                 and isinstance(p[2], int)) for p in path):
            raise PlanError("'critical_path' must be a list of [stage, 'F'|'B', mb]")
        for key in ("schedule", "policy"):
            if not isinstance(data.get(key), str):
                raise PlanError(f"'{key}' must be a string")
        return cls(S, M, data["schedule"], data["policy"], stages, {k: float(v) for k, v in predicted.items()},
                   [(p[0], p[1], p[2]) for p in path])


def _fail(message: str) -> list[PlannedUnit]:
    raise PlanError(message)


def _positive_int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"'{key}' must be a positive integer, got {value!r}")
    return value


def _unit(stage: int, pos: int, raw: Any) -> PlannedUnit:
    where = f"stage {stage} unit {pos}"
    if not isinstance(raw, dict) or set(raw) != {"kind", "mb", "freq_mhz"}:
        raise PlanError(f"{where}: must be {{'kind', 'mb', 'freq_mhz'}}, got {raw!r}")
    kind, mb, freq = raw["kind"], raw["mb"], raw["freq_mhz"]
    if kind not in ("F", "B"):
        raise PlanError(f"{where}: kind must be 'F' or 'B', got {kind!r}")
    for name, value in (("mb", mb), ("freq_mhz", freq)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PlanError(f"{where}: {name} must be a non-negative integer, got {value!r}")
    return PlannedUnit(kind, mb, freq)


def unit_costs(dag: PipelineDag, profile: Profile, freq_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit duration and energy for per-unit clock indices into ``profile.freqs``."""
    s = dag.stage
    dur = np.where(dag.is_fwd, profile.fwd_time[s, freq_idx], profile.bwd_time[s, freq_idx])
    en = np.where(dag.is_fwd, profile.fwd_energy[s, freq_idx], profile.bwd_energy[s, freq_idx])
    return dur, en


def evaluate_plan(plan: Plan, profile: Profile, idle_power_w: float, transfer_s: float = 0.0,
                  tail_s: float | np.ndarray = 0.0) -> Timeline:
    """Re-simulate any plan (also one written by hand) on a profile; clear errors if they do not fit."""
    if plan.num_stages != profile.num_stages:
        raise PlanError(f"plan has {plan.num_stages} stages but the profile has {profile.num_stages}")
    try:
        dag = PipelineDag.from_orders(plan.orders(), plan.num_microbatches)
    except ScheduleError as exc:
        raise PlanError(f"inconsistent plan: {exc}") from None
    clock_index = {int(f): k for k, f in enumerate(profile.freqs)}
    freq_idx = np.empty(dag.num_units, int)
    for s, units in enumerate(plan.stages):
        for u in units:
            if u.freq_mhz not in clock_index:
                raise PlanError(f"stage {s} {u.kind}{u.mb}: {u.freq_mhz} MHz is not a clock of the profile "
                                f"({profile.freqs[-1]}..{profile.freqs[0]} MHz)")
            freq_idx[dag.index(s, u.kind, u.mb)] = clock_index[u.freq_mhz]
    dur, en = unit_costs(dag, profile, freq_idx)
    return simulate(dag, dur, en, idle_power_w, transfer_s, tail_s=tail_s)


def baseline_timeline(profile: Profile, num_microbatches: int, idle_power_w: float,
                      transfer_s: float = 0.0, tail_s: float | np.ndarray = 0.0) -> Timeline:
    """DESIGN's baseline: 1F1B with every unit at the profile's highest clock."""
    dag = PipelineDag.from_orders(one_f_one_b(profile.num_stages, num_microbatches), num_microbatches)
    dur, en = unit_costs(dag, profile, np.zeros(dag.num_units, int))
    return simulate(dag, dur, en, idle_power_w, transfer_s, tail_s=tail_s)


def plan_from_timeline(timeline: Timeline, freqs_mhz: np.ndarray, schedule: str, policy: str,
                       baseline: Timeline) -> Plan:
    """Freeze a simulated assignment (per-unit clocks in MHz) into a Plan with its predictions."""
    dag = timeline.dag
    stages = [[PlannedUnit(*dag.unit(i)[1:], int(freqs_mhz[i])) for i in ids] for ids in dag.order]
    predicted = {
        "iteration_time_s": timeline.iteration_time,
        "energy_j": timeline.energy,
        "baseline_time_s": baseline.iteration_time,
        "baseline_energy_j": baseline.energy,
    }
    assert set(predicted) == set(_PREDICTED_KEYS)
    return Plan(dag.num_stages, dag.num_microbatches, schedule, policy, stages, predicted,
                [dag.unit(i) for i in timeline.critical_path()])

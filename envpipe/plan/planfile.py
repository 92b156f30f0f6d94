"""The plan JSON (DESIGN.md, version 1): the `Plan` type, reading with every check, atomic writing.
(Simulating a plan on a profile: envpipe.plan.evaluate.)

{"version": 1, "num_stages": S, "num_microbatches": M, "schedule": "...", "policy": "...",
 "stages": [[{"kind": "F", "mb": 0, "freq_mhz": 1410}, ...], ...],
 "predicted": {"iteration_time_s": T, "energy_j": E, "baseline_time_s": T0, "baseline_energy_j": E0},
 "critical_path": [[stage, "F", mb], ...],
 "profile_digest": "sha256:..."}   (optional: the Profile.digest the plan was made from)

Optional, still version 1: "predicted" may hold "peak_memory_bytes": [per stage] (activation bytes at the
stage's peak, written when the plan was made with a memory model); readers that do not know it skip it.
A schedule with several model chunks per stage (interleaved 1F1B, DualPipeV) adds "chunks": v at the top,
"chunk": k to every unit and a fourth entry, the chunk, to every critical-path unit; plans with one chunk
per stage have none of these, as before.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeGuard

from envpipe import limits
from envpipe.atomicfile import atomic_write
from envpipe.limits import (
    MAX_CLOCK_MHZ,
    MAX_JSON_DEPTH,
    MAX_MICROBATCHES,
    MAX_PLAN_BYTES,
    MAX_STAGES,
    quote,
    read_text,
    units_error,
)
from envpipe.plan.dag import PipelineDag, ScheduleError, engine_order_dag
from envpipe.plan.layout import StageLayout
from envpipe.plan.schedules import ChunkUnit, Unit, schedule_layout
from envpipe.profile import Profile

PLAN_VERSION = 1
_TOP_KEYS = {"version", "num_stages", "num_microbatches", "schedule", "policy", "stages", "predicted",
             "critical_path", "profile_digest", "chunks"}
PREDICTED_KEYS = ("iteration_time_s", "energy_j", "baseline_time_s", "baseline_energy_j")
_PEAK_MEMORY = "peak_memory_bytes"  # optional per-stage list inside "predicted"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class PlanError(ValueError):
    """A plan file is malformed or does not fit the profile it is evaluated with."""


@dataclass(frozen=True)
class PlannedUnit:
    kind: str
    mb: int
    freq_mhz: int
    chunk: int = 0  # which of its stage's model chunks (interleaved 1F1B, DualPipeV)


@dataclass(frozen=True)
class Plan:
    """A clock for every unit of one iteration, in each stage's execution order, with the planner's prediction.
    Never changed once made (``with_clocks`` and ``dataclasses.replace`` make new ones), so its DAG is built once."""

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
    profile_digest: str | None = None  # Profile.digest of the profile it was planned on; None when unknown

    @classmethod
    def at_one_clock(cls, orders: Sequence[Sequence[Unit]], mhz: int, schedule: str, policy: str) -> Plan:
        """A plan of one-chunk ``orders`` with every unit at ``mhz`` (at the top clock: the baseline's clocks)."""
        return cls(len(orders), len(orders[0]) // 2, schedule, policy,
                   [[PlannedUnit(k, m, mhz) for k, m in order] for order in orders])

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

    @cached_property
    def dag(self) -> PipelineDag:
        """The plan's iteration DAG (PlanError if its orders are not a valid, deadlock-free iteration)."""
        try:
            return PipelineDag.from_orders(self.chunk_orders() if self.chunks > 1 else self.orders(),
                                           self.num_microbatches, self.layout())
        except ScheduleError as exc:
            raise PlanError(f"inconsistent plan: {exc}") from None

    def clocks(self) -> list[list[int]]:
        """Per stage, the planned SM clock (MHz) of each unit in execution order."""
        return [[u.freq_mhz for u in units] for units in self.stages]

    def with_clocks(self, clocks: list[list[int]], predicted: dict[str, float] | None = None) -> Plan:
        """The same order with other clocks (and, if given, other predictions)."""
        stages = [[replace(u, freq_mhz=f) for u, f in zip(units, cs, strict=True)]
                  for units, cs in zip(self.stages, clocks, strict=True)]
        plan = replace(self, stages=stages, predicted=dict(self.predicted if predicted is None else predicted))
        if "dag" in self.__dict__:  # the same order: the DAG already built is the new plan's too
            plan.__dict__["dag"] = self.dag
        return plan

    def to_json(self) -> dict[str, Any]:
        data = {
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
        if self.profile_digest is not None:
            data["profile_digest"] = self.profile_digest
        return data

    def save(self, path: str | Path) -> None:
        """Write atomically (an interrupted write never leaves a corrupt plan), creating missing directories."""
        with atomic_write(path) as fh:
            fh.write(_plan_text(self.to_json()))

    def check_profile(self, profile: Profile) -> None:
        """Refuse a profile other than the one this plan was made from (plans without a digest pass)."""
        if self.profile_digest is not None and self.profile_digest != profile.digest:
            raise PlanError(f"made from another profile than {profile.source} ({self.profile_digest[:19]}..., "
                            f"this profile is {profile.digest[:19]}...); plan again on it, or delete the "
                            "plan's profile_digest to simulate it anyway")

    def pipeline_error(self, num_stages: int, num_microbatches: int) -> str | None:
        """Why DeepSpeed's pipeline engine cannot run this plan in a pipeline of ``num_stages`` stages and
        ``num_microbatches`` micro-batches (another shape, or an order it does not run), or None."""
        if (self.num_stages, self.num_microbatches) != (num_stages, num_microbatches):
            return (f"plan is for {self.num_stages} stages x {self.num_microbatches} micro-batches, this run has "
                    f"{num_stages} x {num_microbatches}")
        try:
            engine_order_dag(self.orders(), num_microbatches)
        except (ScheduleError, PlanError) as exc:
            return str(exc)
        return None

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            return cls.from_json(parse_json(read_text(path, MAX_PLAN_BYTES, "plan")))
        except OSError as exc:
            raise PlanError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except ValueError as exc:  # PlanError included
            raise PlanError(f"{path}: {exc}") from None

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        if not isinstance(data, dict):
            raise PlanError("a plan is a JSON object")
        if limits.json_depth(data) > MAX_JSON_DEPTH:
            raise PlanError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise PlanError(f"unknown key(s): {', '.join(quote(k) for k in sorted(unknown)[:5])}")
        version = data.get("version")
        if not _is_int(version) or version != PLAN_VERSION:
            raise PlanError(f"unsupported plan version {quote(version)} (this tool reads {PLAN_VERSION})")
        S = _int_in(data, "num_stages", 1, MAX_STAGES)
        M = _int_in(data, "num_microbatches", 1, MAX_MICROBATCHES)
        chunks = _int_in(data, "chunks", 1, MAX_STAGES) if "chunks" in data else 1
        too_big = units_error(S * chunks, M)
        if too_big:
            raise PlanError(too_big)
        stages_raw = data.get("stages")
        if not isinstance(stages_raw, list) or len(stages_raw) != S:
            raise PlanError(f"'stages' must be a list of {S} stage lists")
        stages = [[_unit(s, i, u, M, chunks) for i, u in enumerate(units)] if isinstance(units, list)
                  else _fail(f"stage {s} is not a list") for s, units in enumerate(stages_raw)]
        predicted = data.get("predicted", {})
        peak = _peak_memory(predicted, S)
        if isinstance(predicted, dict):
            predicted = {k: v for k, v in predicted.items() if k != _PEAK_MEMORY}
        if not isinstance(predicted, dict) or not all(_is_number(v) for v in predicted.values()):
            raise PlanError("'predicted' must map names to numbers")
        path = data.get("critical_path", [])
        if not isinstance(path, list) or len(path) > 2 * S * M * chunks or not all(
                _is_path_unit(p, S, M, chunks) for p in path):
            entry = f"[stage < {S}, 'F'|'B', mb < {M}" + (f", chunk < {chunks}]" if chunks > 1 else "]")
            raise PlanError(f"'critical_path' must be a list of {entry}")
        for key in ("schedule", "policy"):
            if not isinstance(data.get(key), str):
                raise PlanError(f"'{key}' must be a string")
        digest = data.get("profile_digest")
        if digest is not None and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
            raise PlanError(f"'profile_digest' must be 'sha256:' and 64 hex digits, got {quote(digest)}")
        return cls(S, M, data["schedule"], data["policy"], stages, {k: float(v) for k, v in predicted.items()},
                   [(p[0], p[1], p[2]) if chunks == 1 else (p[0], p[1], p[2], p[3]) for p in path],
                   peak_memory_bytes=peak, chunks=chunks, profile_digest=digest)


def parse_json(text: str) -> Any:
    """JSON as plans allow it: finite numbers only, integers of at most 18 digits, nesting within reason."""
    try:
        return limits.parse_json(text)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def _peak_memory(predicted: Any, num_stages: int) -> list[int] | None:
    if not isinstance(predicted, dict) or _PEAK_MEMORY not in predicted:
        return None
    peak = predicted[_PEAK_MEMORY]
    if not isinstance(peak, list) or len(peak) != num_stages or any(not _is_int(b) or b < 0 for b in peak):
        raise PlanError(f"'predicted.{_PEAK_MEMORY}' must be a list of {num_stages} whole numbers >= 0")
    return list(peak)


def _fail(message: str) -> list[PlannedUnit]:
    raise PlanError(message)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not 1


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _int_in(data: dict[str, Any], key: str, low: int, high: int) -> int:
    value = data.get(key)
    if not _is_int(value) or not low <= value <= high:
        raise PlanError(f"'{key}' must be an integer in [{low}, {high}], got {quote(value)}")
    return value


def _is_path_unit(p: Any, S: int, M: int, chunks: int) -> bool:
    width = 3 if chunks == 1 else 4
    return (isinstance(p, list) and len(p) == width and _is_int(p[0]) and 0 <= p[0] < S and p[1] in ("F", "B")
            and _is_int(p[2]) and 0 <= p[2] < M and (chunks == 1 or (_is_int(p[3]) and 0 <= p[3] < chunks)))


def _unit(stage: int, pos: int, raw: Any, M: int, chunks: int) -> PlannedUnit:
    where = f"stage {stage} unit {pos}"
    keys = ("kind", "mb", "freq_mhz", *(("chunk",) if chunks > 1 else ()))
    if not isinstance(raw, dict) or set(raw) != set(keys):
        raise PlanError(f"{where}: must be {{{', '.join(repr(k) for k in keys)}}}, got {quote(raw)}")
    kind, mb, freq, chunk = raw["kind"], raw["mb"], raw["freq_mhz"], raw.get("chunk", 0)
    if kind not in ("F", "B"):
        raise PlanError(f"{where}: kind must be 'F' or 'B', got {quote(kind)}")
    if not _is_int(mb) or not 0 <= mb < M:
        raise PlanError(f"{where}: mb must be an integer in [0, {M - 1}], got {quote(mb)}")
    if not _is_int(freq) or not 1 <= freq <= MAX_CLOCK_MHZ:
        raise PlanError(f"{where}: freq_mhz must be an integer in [1, {MAX_CLOCK_MHZ}], got {quote(freq)}")
    if not _is_int(chunk) or not 0 <= chunk < chunks:
        raise PlanError(f"{where}: chunk must be an integer in [0, {chunks - 1}], got {quote(chunk)}")
    return PlannedUnit(kind, mb, freq, chunk)


def _plan_text(data: dict[str, Any]) -> str:
    """The plan's JSON with a unit (and a critical-path unit) per line. json's C encoder writes each line; an
    indented dump goes through json's Python encoder instead, which took 3.9 s of a 64 x 1,024 plan's 56 s
    (2-core VM, 2026-11-29) for a file twice the size."""
    fields = []
    for key, value in data.items():
        if key == "stages":
            text = _lines([_lines([_dumps(u) for u in units], "   ") for units in value], "  ")
        elif key == "critical_path":
            text = _lines([_dumps(u) for u in value], "  ")
        else:
            text = json.dumps(value, indent=1, allow_nan=False).replace("\n", "\n ")
        fields.append(f"{_dumps(key)}: {text}")
    return "{\n" + ",\n".join(f" {field}" for field in fields) + "\n}\n"


def _lines(items: list[str], indent: str) -> str:
    """A JSON array of already-encoded ``items``, one per line at ``indent``."""
    if not items:
        return "[]"
    return "[\n" + ",\n".join(indent + item for item in items) + "\n" + indent[:-1] + "]"


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False)

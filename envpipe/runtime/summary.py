"""The run's summary (`summary.json`): one typed object that every reader goes through.

`RunSummary` is what the runtime writes and what the text report, the CML notebook, the benchmarks and
`run_stock` read (`RunSummary.load`), never dict keys. `summary.schema.json` beside this module is the
JSON Schema of the file, generated from these dataclasses (`python -m envpipe.runtime.summary` rewrites
it; a test keeps the two equal and validates the runtime's files against it).

Every number carries its kind. *Measured*: timers, the NVML counter, or the sim clock's counter on CPU
(the clock is simulated there, so its energy is labelled simulated, but the plan's and the baseline's
iterations are read from the same counter). *Simulated*: the planner's prediction. A saving or slowdown
is only ever computed between two numbers of one kind: `measured` compares the plan's iterations with
the same run's interleaved 1F1B all-max iterations; `predicted` compares the planner's prediction for
the plan with its own 1F1B all-max baseline.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envpipe.atomicfile import atomic_write

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")


@dataclass(frozen=True)
class Spread:
    """A measured quantity over iterations: its median, quartiles and range."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        xs = sorted(float(v) for v in values)
        if not xs:
            return None
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
        return cls(statistics.median(xs), q1, q3, xs[0], xs[-1], len(xs))


@dataclass(frozen=True)
class Iterations:
    """Measured iterations of one configuration of this run (the plan's, or 1F1B all-max)."""

    time_s: Spread  # the job's iteration: its slowest rank
    energy_j: Spread | None  # the whole job's energy per iteration (every GPU); None without a counter
    throughput_samples_per_s: float  # samples per iteration over the median time


@dataclass(frozen=True)
class MeasuredComparison:
    """The plan's iterations against this run's interleaved 1F1B all-max iterations, pair by pair."""

    pairs: int
    energy_saving: Spread | None  # per pair: 1 - plan energy / baseline energy
    slowdown: Spread  # per pair: plan time / baseline time - 1
    energy: str  # the counter both sides were read from


@dataclass(frozen=True)
class PredictedComparison:
    """The planner's prediction for the plan against its own 1F1B all-max baseline (simulated, both)."""

    iteration_time_s: float
    energy_j: float  # the whole job's (every replica's plan)
    baseline_time_s: float
    baseline_energy_j: float
    energy_saving: float
    slowdown: float
    profile: str  # what the simulation ran on (online profile, profile file, measured units + model)


@dataclass(frozen=True)
class MemoryUse:
    """Activation memory of one stage, as the order choice saw it (bytes, measured in calibration)."""

    activation_bytes_per_microbatch: int  # tensors saved for backward, and the stage's output
    static_bytes: int  # parameters, gradients, optimizer state
    limit_bytes: int | None  # the device's memory, or the configured limit; None: no limit (CPU)
    available_bytes: int | None  # for in-flight activations: the limit less the headroom and the static bytes
    max_in_flight: int | None  # micro-batches whose activations fit
    planned_in_flight: int  # what the order that ran keeps at most


@dataclass(frozen=True)
class PlanInfo:
    """What runs in the steady phase, where it came from, and the order's memory."""

    policy: str  # optimal, baseline, uniform, envelope
    order: str  # 1f1b, or envpipe with its extra warm-up forwards per stage
    source: str  # planner on an online profile | a profile file | a plan file (name and digest) | EnvPipe's rule
    digest: str  # sha256 of the orders and clocks of every stage (16 hex digits)
    budget_s: float | None  # the planner's iteration-time budget (simulated)
    orders: list[list[str]]  # per stage, e.g. "F0"
    clocks: list[list[int]] | None  # per stage, planned SM clock per unit (MHz); None: clocks left alone
    memory: list[MemoryUse] | None
    refused_orders: list[str]  # orders the memory limit or the budget ruled out, with why
    deployed: bool  # False: clocks cannot be changed here; the plan is reported, not run


@dataclass(frozen=True)
class Refusal:
    """A clock request the clock daemon refused."""

    rank: int
    mhz: int
    status: int
    message: str


@dataclass(frozen=True)
class ClockInfo:
    """Which clock the ranks had, and what its energy numbers are."""

    kind: str  # sim, daemon, nvml (energy only), none
    controls_clocks: bool
    energy: str  # "simulated (sim clock)", "measured (NVML counter)", "none"
    time: str  # "measured (wall clock)", or on CPU "simulated (sim clock's GPU time)": the GPU's virtual time
    note: str | None  # why clocks are not controlled
    refusals: list[Refusal]


@dataclass(frozen=True)
class Calibration:
    """Simulator inputs measured in the calibration iterations (1F1B, all clocks at max)."""

    iterations: int
    time_s: Spread  # measured 1F1B all-max iterations
    fwd_s: list[float]
    bwd_s: list[float]
    gap_s: list[float]
    transfer_s: float
    tail_s: list[float]
    head_s: float
    effective_clock_mhz: list[float | None]  # per stage, the SM clock NVML saw under load (power cap)
    idle_power_w: float | None  # the GPU's blocking power used by the planner


@dataclass(frozen=True)
class ReconfigRound:
    """One reconfiguration iteration: its measured time and the clocks it ran."""

    round: int
    measured_time_s: float
    clocks: list[list[int]]


@dataclass(frozen=True)
class Reconfiguration:
    """The reconfiguration phase: re-planning (optimal) or EnvPipe's raises, from measured iterations."""

    method: str  # replan (optimal), greedy, balanced
    rounds: list[ReconfigRound]
    target_s: float | None  # replan: the measured iteration the plan must stay within
    stop_reason: str
    raises: int | None  # EnvPipe's methods: clock raises


@dataclass(frozen=True)
class UnitEnergy:
    """Mean unit energies of one GPU (counter interpolated at unit boundaries)."""

    fwd_j: float | None  # mean forward unit energy (counter interpolated at unit boundaries)
    bwd_j: float | None
    wait_power_w: float | None  # power outside units, from the counter (coarse on a 100 ms counter)


@dataclass(frozen=True)
class GpuSummary:
    """One GPU (rank) of the job, over the plan's steady iterations."""

    rank: int
    replica: int
    stage: int
    host: str
    energy_per_iteration_j: float | None  # median over the plan's steady iterations
    peak_memory_bytes: int | None
    unit_energy: UnitEnergy | None


@dataclass(frozen=True)
class NodeSummary:
    """One node of the job: its ranks and their energy per iteration."""

    node: int
    host: str
    ranks: list[int]
    energy_per_iteration_j: float | None


@dataclass(frozen=True)
class ReplicaSummary:
    """One data-parallel replica of the pipeline (measured)."""

    replica: int
    iteration_time_s: float | None
    pipeline_time_s: float | None  # until its last stage ends its units, before the all-reduce
    energy_per_iteration_j: float | None
    straggler: bool


@dataclass(frozen=True)
class StageTail:
    """One stage's work after its last unit (gradient all-reduce, optimizer step), per replica."""

    stage: int
    measured_allreduce_s: list[float | None]  # per replica
    measured_tail_s: list[float | None]  # step end - last unit end
    simulated_tail_s: float | None  # the calibrated tail in the prediction, less the head


@dataclass(frozen=True)
class StragglerRule:
    """What the straggler rule did: the other replicas' frontier plan (simulated numbers)."""

    replica: int
    applied: bool
    reason: str | None
    straggler_predicted_time_s: float | None
    predicted_time_s: float | None
    predicted_energy_per_replica_j: float | None


@dataclass(frozen=True)
class JobSummary:
    """The whole job: nodes, replicas, stragglers, all-reduce tails."""

    data_parallel: int
    gpus: int
    nodes: list[NodeSummary]
    replicas: list[ReplicaSummary]
    straggler_replica: int | None
    straggler_seen_in: str | None  # steady iterations, or calibration/profiling
    straggler_threshold: float
    straggler_rule: StragglerRule | None
    tails: list[StageTail]
    plans_identical_across_replicas: bool
    plan_digest_per_rank: list[str]  # rank order: equal digests, identical orders and clocks


@dataclass(frozen=True)
class MeasuredUnit:
    """A unit of the last timed iteration, from the iteration's start (measured)."""

    kind: str
    mb: int
    start_s: float
    end_s: float
    mhz: int | None


@dataclass(frozen=True)
class RunSummary:
    """One run of the EnvPipe runtime (or of stock DeepSpeed for comparison): summary.json."""

    schema_version: int
    engine: str  # envpipe, or stock-deepspeed-1f1b
    stages: int
    microbatches: int
    data_parallel: int
    samples_per_iteration: int
    clock: ClockInfo
    plan: PlanInfo | None
    steady: Iterations  # the plan's iterations (stock: every measured iteration)
    baseline: Iterations | None  # this run's interleaved 1F1B all-max iterations
    measured: MeasuredComparison | None
    predicted: PredictedComparison | None
    predicted_iteration_time_s: float | None  # the calibrated simulator's time for what ran
    prediction_error: float | None  # measured median / predicted - 1
    calibration: Calibration | None
    reconfiguration: Reconfiguration | None
    gpus: list[GpuSummary]  # replica-major
    job: JobSummary
    units_last_iteration: list[list[MeasuredUnit]] = field(default_factory=list)  # replica 0, per stage

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write atomically (no half-written summary for a reader to trip on)."""
        with atomic_write(path) as fh:
            json.dump(self.to_json(), fh, indent=1)
            fh.write("\n")

    @classmethod
    def from_json(cls, data: Any) -> RunSummary:
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"not a version {SCHEMA_VERSION} EnvPipe run summary")
        return _build(cls, data, "summary")

    @classmethod
    def load(cls, path: str | Path) -> RunSummary:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: cannot read the run summary: {exc}") from None
        try:
            return cls.from_json(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


# --- typed reading and the schema, both from the dataclasses' annotations ---------------------------------

def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[__name__]))


def _build(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as type ``tp``; ValueError naming the field on a mismatch."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _build(inner, value, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        hints = _hints(tp)  # type: ignore[arg-type]
        missing = [n for n in hints if n not in value]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        return tp(**{n: _build(h, value[n], f"{where}.{n}") for n, h in hints.items()})  # type: ignore[operator]
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        return [_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: expected a number")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ValueError(f"{where}: expected {tp.__name__}")
        return value
    raise TypeError(f"unsupported summary type {tp!r}")


def _schema_of(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return {"anyOf": [_schema_of(inner, defs), {"type": "null"}]}
    if dataclasses.is_dataclass(tp):
        name = tp.__name__  # type: ignore[union-attr]
        if name not in defs:
            defs[name] = {}  # placeholder: a type that refers to itself terminates
            hints = _hints(tp)  # type: ignore[arg-type]
            defs[name] = {
                "type": "object",
                "description": (tp.__doc__ or name).split("\n")[0],
                "properties": {n: _schema_of(h, defs) for n, h in hints.items()},
                "required": list(hints),
                "additionalProperties": False,
            }
        return {"$ref": f"#/$defs/{name}"}
    if origin is list:
        return {"type": "array", "items": _schema_of(args[0], defs)}
    return {float: {"type": "number"}, int: {"type": "integer"}, str: {"type": "string"},
            bool: {"type": "boolean"}}[tp]


def schema() -> dict[str, Any]:
    """The JSON Schema of summary.json (draft 2020-12)."""
    defs: dict[str, Any] = {}
    _schema_of(RunSummary, defs)
    body = defs.pop("RunSummary")
    body["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "envpipe-run-summary-v1",
            "title": "EnvPipe run summary", **body, "$defs": dict(sorted(defs.items()))}


if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(schema(), indent=1) + "\n")
    print(f"wrote {SCHEMA_PATH}")

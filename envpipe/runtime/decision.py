"""The plain types the phases hand on: what calibration measured (`CalibrationResult`), what rank 0 decided
(`Decision`, from an `Origin`, for a `Job`) and both together (`Decided`, kept for the report and carried in
checkpoints). Phases, the checkpoint and the report import them from here, not from one another."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, replace

from envpipe.plan.memory import peak_in_flight
from envpipe.plan.planfile import Plan
from envpipe.plan.simulate import Overheads
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.measure.replicas import StageStats
from envpipe.runtime.measure.timing import SimInputs


@dataclass(frozen=True)
class CalibrationResult:
    timing: SimInputs  # the simulator's inputs
    report: S.Calibration  # the same, with what else was measured, for the summary
    memory: list[S.MemoryUse]  # per stage
    unit_energies: list[StageStats]  # per stage, its slowest replica's, with its units' mean energies
    straggler: int | None  # a replica slower than the others' median by the threshold
    idle_power_w: float | None  # the idle GPU's power
    blocking_power_w: list[float] | None  # per stage: power while waiting for a neighbour (measured)
    tail_power_w: list[float] | None  # per stage: power in the tail (measured)
    # per rank (global): its GPU blocked in a collective (measured; None: not measured); kept in a checkpoint,
    # so that a resumed job splits its iterations' energy as the calibrated one did
    waiting_power_w: list[float | None] | None = None

    def waiting_power_of(self, rank: int) -> float | None:
        return None if self.waiting_power_w is None else self.waiting_power_w[rank]

    def overheads(self) -> Overheads:
        """What an iteration costs besides its units, as measured: the transfer, each stage's tail, and the power
        each stage draws while blocked and in its tail (the idle GPU's where nothing was measured)."""
        idle = self.idle_power_w or 0.0
        stages = len(self.timing.tail_s)
        blocking = self.blocking_power_w or idle
        return Overheads.broadcast(stages, blocking, self.timing.transfer_s, self.timing.tail_s,
                                   self.tail_power_w or blocking)


class Origin(enum.Enum):
    """Where a decision's plan came from."""

    PLAN_FILE = "plan file"
    RULE = "EnvPipe's rule"
    PLANNER = "planner"


@dataclass(frozen=True)
class Job:
    """The job rank 0 decides for."""

    stages: int
    microbatches: int
    replicas: int  # data-parallel
    controls: bool  # clocks can be set here: the plan's clocks are deployed
    f_max: int  # the top clock (MHz): the baseline's


@dataclass(frozen=True)
class Decision:
    """What every replica runs, where it came from, and the planner's prediction (simulated)."""

    origin: Origin
    source: str  # where the plan came from, in words (the report's)
    policy: str  # optimal, baseline, uniform, envelope
    order: str  # the order's name: 1f1b, or envpipe with its extra warm-up forwards per stage
    plans: dict[int, Plan]  # per data-parallel replica
    clocks_settable: bool  # planned for clocks that can be set here (the report says whether they ran)
    budget_s: float | None = None  # the optimal planner's iteration-time budget (simulated)
    memory: tuple[S.MemoryUse, ...] = ()  # per stage, as calibration measured it
    refused_orders: tuple[str, ...] = ()  # orders the memory limit or the budget ruled out, with why
    predicted: S.PredictedComparison | None = None
    predicted_time_s: float | None = None  # the job's iteration under the plans (calibrated simulator)
    profile: Profile | None = None  # what the planner planned on (rank 0 re-plans from it)
    straggler_rule: S.StragglerRule | None = None

    def plan_for(self, replica: int) -> Plan:
        return self.plans[replica]

    @property
    def info(self) -> S.PlanInfo:
        """Replica 0's plan, as the report names it; its memory counts the plan's own in-flight micro-batches
        (calibration measured them under 1F1B's)."""
        plan = self.plans[0]
        held = peak_in_flight(plan.orders())
        memory = [replace(m, planned_in_flight=held[s]) for s, m in enumerate(self.memory)]
        return S.PlanInfo(self.policy, self.order, self.source, plan_digest(plan), self.budget_s,
                          [[f"{u.kind}{u.mb}" for u in units] for units in plan.stages], plan.clocks(),
                          memory or None, list(self.refused_orders), self.clocks_settable)


@dataclass(frozen=True)
class Decided:
    """What the phases decided and what from: kept for the report and carried in checkpoints."""

    calibrated: CalibrationResult
    decision: Decision
    reconfiguration: S.Reconfiguration | None


def plan_digest(plan: Plan) -> str:
    """sha256 of every stage's order and clocks (16 hex digits): equal digests, identical plans."""
    text = json.dumps([[[u.kind, u.mb, u.freq_mhz] for u in units] for units in plan.stages])
    return hashlib.sha256(text.encode()).hexdigest()[:16]

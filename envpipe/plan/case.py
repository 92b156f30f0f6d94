"""What a planner is given and what it returns.

`PipelineCase` is one pipeline to plan: the profile, the micro-batches, what an iteration costs besides its
units (`Overheads`: transfer, per-stage tails, blocking and tail power), the activation memory and which model
stages each pipeline stage runs. It says nothing about *how* to plan: the schedule, EnvPipe's policy and
reconfiguration, the time budget stay the planners' own arguments. The CLI, the configuration search and the
runtime build a case from what they measured; every planner and evaluator takes it.

`Planned` is what both planners (EnvPipe's `make_plan` and the optimal `optimal_plan`, and each point of a
`frontier`) return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from envpipe.plan.layout import StageLayout, model_profile
from envpipe.plan.memory import StageMemory
from envpipe.plan.planfile import Plan
from envpipe.plan.simulate import Overheads, PerStage, Timeline
from envpipe.profile import Profile

_ONE_PER_STAGE = StageLayout(())  # the default layout: one model stage per pipeline stage, set in __post_init__


@dataclass(frozen=True, eq=False)
class PipelineCase:
    """One pipeline to plan (see the module's docstring)."""

    profile: Profile  # one row per pipeline stage, or one per model stage of ``layout`` (envpipe.plan.layout)
    num_microbatches: int
    overheads: Overheads  # per pipeline stage
    memory: StageMemory | None = None  # activation bytes per in-flight micro-batch and bytes available; None: no limit
    layout: StageLayout = field(default=_ONE_PER_STAGE)  # default: one model stage per pipeline stage

    def __post_init__(self) -> None:
        if self.num_microbatches < 1:
            raise ValueError("the number of micro-batches must be at least 1")
        if not self.layout.model_stage:
            object.__setattr__(self, "layout", StageLayout.single(self.overheads.num_stages))
        S = self.layout.num_stages
        if self.overheads.num_stages != S:
            raise ValueError(f"overheads are given for {self.overheads.num_stages} stages, the pipeline has {S}")
        if self.memory is not None and self.memory.num_stages != S:
            raise ValueError(f"memory is given for {self.memory.num_stages} stages, the pipeline has {S}")
        model_profile(self.profile, self.layout)  # one clear error for a profile that does not fit the layout

    @classmethod
    def of(cls, profile: Profile, num_microbatches: int, blocking_power_w: PerStage, transfer_s: float = 0.0,
           tail_s: PerStage = 0.0) -> PipelineCase:
        """A case with one model stage per pipeline stage (a profile row each), no memory limit, and tails at the
        blocking power: one number for every stage, or one per stage."""
        return cls(profile, num_microbatches,
                   Overheads.broadcast(profile.num_stages, blocking_power_w, transfer_s, tail_s))

    @property
    def num_stages(self) -> int:
        """Pipeline stages (GPUs)."""
        return self.layout.num_stages

    @cached_property
    def model_profile(self) -> Profile:
        """The profile with one row per model stage (a pipeline stage's row split evenly over its chunks)."""
        return model_profile(self.profile, self.layout)


@dataclass(frozen=True)
class Planned:
    """A planner's result: the plan, its simulated iteration and the baseline it is compared with.

    ``budget_s`` is the time budget planned for; EnvPipe's policies plan for none (None): they aim at the
    baseline's time without a guarantee, so ``overrun`` compares them with the baseline instead.
    """

    plan: Plan
    timeline: Timeline  # the plan simulated on the case
    baseline: Timeline  # 1F1B with every unit at the highest clock (a chunked schedule: that schedule's)
    reschedule: list[int]  # EnvPipe's extra warm-up forwards per stage of the plan's order (all 0: none)
    budget_s: float | None
    tried: list[tuple[list[int], float | None]]  # every order tried: (r_s, its energy, or None if none fit)
    bound_j: float | None = None  # a lower bound on the energy of the plan's order within the budget, if known
    reconfig_rounds: int = 0  # simulated iterations of EnvPipe's reconfiguration (0: none ran)
    notes: tuple[str, ...] = ()  # what the planner did, one line each (for people, not for programs)

    @property
    def overrun(self) -> float:
        """How much slower the plan is than its budget (or, without one, the baseline), as a fraction; 0 within."""
        limit = self.baseline.iteration_time if self.budget_s is None else self.budget_s
        return max(0.0, self.timeline.iteration_time / limit - 1.0)

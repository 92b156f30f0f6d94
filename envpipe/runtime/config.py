"""The `envpipe` block of a DeepSpeed config and the ENVPIPE_* environment variables.

    "envpipe": {"type": "optimal", "scheduling": "envpipe", "max_slowdown": 0.0, "clock": "auto",
                "report_dir": "envpipe-report", "memory_headroom": 0.1, ...}

`type` is the policy: `optimal` (the default: least energy within the time budget, the order chosen
within memory) or EnvPipe's `baseline`, `uniform`, `envelope` (kept for comparison). ENVPIPE_TYPE,
ENVPIPE_SCHEDULING and ENVPIPE_RECONFIGURE override the block, as in EnvPipe; ENVPIPE_CLOCK overrides
`clock` (the launcher's worker pods set it to `daemon` where clockd runs). The block is a pydantic
model, as DeepSpeed's own config blocks are; every mistake is one line naming the key or variable.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from envpipe.limits import parse_slowdown

Policy = Literal["optimal", "baseline", "uniform", "envelope"]
Scheduling = Literal["1f1b", "envpipe"]
Reconfig = Literal["default", "greedy", "balanced", "replan"]
ClockKind = Literal["auto", "sim", "sim-readonly", "daemon", "readonly", "none"]
Straggler = Literal["report", "frontier"]
CALIBRATION_LEAST = 6  # until settled: two warm-ups and the four iterations whose medians of three are compared
REPLAN = "replan"  # the optimal policy's reconfiguration: re-plan from measured units until within budget
ENVIRONMENT = {"type": "ENVPIPE_TYPE", "scheduling": "ENVPIPE_SCHEDULING", "reconfig": "ENVPIPE_RECONFIGURE",
               "clock": "ENVPIPE_CLOCK"}

Text = Annotated[str, Field(min_length=1)]
Fraction = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # [0, 1)
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Slowdown = Annotated[float, BeforeValidator(parse_slowdown)]  # a fraction in [0, 1), or a percent: "5%"


class EnvPipeConfigError(ValueError):
    """An invalid `envpipe` block or ENVPIPE_* variable (its message is one line)."""


class EnvPipeConfig(BaseModel):
    """What the runtime does; every field has a default, so an empty block is a complete configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    type: Policy = "optimal"
    scheduling: Scheduling = "envpipe"  # optimal: may choose EnvPipe's extra warm-up forwards (or 1F1B) within memory
    reconfig: Reconfig | None = None  # None: 'replan' for optimal, EnvPipe's 'default' (none) for its policies
    # auto: sim on CPU; on GPUs the daemon when it answers, else default clocks (one line). readonly: the NVML
    # energy counter, clocks never changed (what auto falls back to). sim-readonly: a simulated GPU whose clocks
    # cannot be set (CPU: what a GPU node without the daemon does). none: no clock, no energy.
    clock: ClockKind = "auto"
    # where clocks cannot be set: stretch every unit the plan runs below its top clock by the extra time the
    # frequency model predicts at its planned clock (envpipe.runtime.phases.rehearse), interleaved with 1F1B all-max
    # iterations, so the plan's timing is measured before any clock daemon exists
    rehearse: bool = False
    # replay each stage's forwards and backwards as CUDA graphs, one per micro-batch in flight (GPUs only): a
    # unit that the host's issuing sets the pace of then takes the device's time (envpipe.runtime.engine.graphs)
    cuda_graphs: bool = False
    gpu: Text | None = None  # EnvPipe's clock candidate rule (its policies)
    plan: Text | None = None  # skip profiling and planning: run this plan file
    profile: Text | None = None  # skip profiling: plan from this profile CSV
    report_dir: Text = "envpipe-report"
    pipeline_stages: Annotated[int, Field(ge=1)] | None = None  # checked against the model's (a found config's)
    straggler: Straggler = "report"  # "frontier": replicas waiting for a straggler take a cheaper plan
    straggler_threshold: Positive = 0.05  # a replica this much slower than the others' median straggles
    max_slowdown: Slowdown | None = None  # budget: the run's own 1F1B all-max iteration times (1 + this)
    time_budget_s: Positive | None = None  # or an absolute iteration-time budget
    memory_limit_bytes: Annotated[int, Field(ge=1)] | None = None  # per GPU; default on GPUs: the device's memory
    memory_headroom: Fraction = 0.1  # the share of the limit that in-flight activations may not use
    # 1F1B all-max iterations before planning (the first two warm up): None, until the median of the last few
    # iteration times moves by at most `calibration_tolerance` (at least CALIBRATION_LEAST, at most
    # `calibration_max_iterations`); a number: exactly that many (envpipe.runtime.phases.calibrate). Each unit's
    # time is its median over the settled iterations.
    calibration_iterations: Annotated[int, Field(ge=1)] | None = None
    calibration_max_iterations: Annotated[int, Field(ge=CALIBRATION_LEAST)] = 30
    calibration_tolerance: Fraction = 0.01
    compare_iterations: Annotated[int, Field(ge=0)] = 10  # steady 1F1B all-max iterations interleaved with the plan's
    profile_points: Annotated[int, Field(ge=1)] = 4  # clocks profiled online
    reconfigure_rounds: Annotated[int, Field(ge=1)] = 5  # most reconfiguration rounds
    monitor_interval: Annotated[int, Field(ge=1)] = 10  # iterations between the job's monitor events (a gather)
    log_interval: Annotated[int, Field(ge=0)] = 10  # rank 0 prints every N-th iteration (0: phases only)
    progress_total: Annotated[int, Field(ge=1)] | None = None  # the job's steps, if known: progress lines say i/N
    summary_interval: Annotated[int, Field(ge=1)] = 50  # steady iterations between rewrites of the report

    @property
    def calibration_range(self) -> tuple[int, int]:
        """(least, most) calibration iterations: the given count, or from CALIBRATION_LEAST until settled."""
        if self.calibration_iterations is not None:
            return self.calibration_iterations, self.calibration_iterations
        return CALIBRATION_LEAST, self.calibration_max_iterations

    @property
    def reconfig_method(self) -> str:
        if self.reconfig is not None:
            return self.reconfig
        return REPLAN if self.type == "optimal" else "default"

    @model_validator(mode="after")
    def _consistent(self) -> EnvPipeConfig:
        if self.plan and self.profile:
            raise ValueError("give either 'plan' (skip profiling and planning) or 'profile' (skip profiling), not both")
        if self.max_slowdown is not None and self.time_budget_s is not None:
            raise ValueError("give either 'max_slowdown' or 'time_budget_s', not both")
        if self.clock == "none" and self.type != "baseline" and not self.plan and not self.profile:
            raise ValueError(f"policy '{self.type}' plans clocks from a profile, which clock 'none' cannot measure: "
                             "use clock 'auto', give 'profile' or 'plan', or use type 'baseline'")
        if self.rehearse and self.type == "baseline" and not self.plan:
            raise ValueError("'rehearse' stretches units by their planned clocks: policy 'baseline' plans none (use "
                             "type 'optimal', 'uniform' or 'envelope', or give 'plan')")
        if self.rehearse and self.clock == "none":
            raise ValueError("'rehearse' measures a plan against this run's 1F1B iterations: clock 'none' has no GPU "
                             "time to stretch; use clock 'auto'")
        if self.reconfig == REPLAN and self.type != "optimal":
            raise ValueError(f"reconfig '{REPLAN}' re-plans with the optimal planner: it needs type 'optimal'")
        return self


def parse(block: Any, environ: Mapping[str, str] | None = None) -> EnvPipeConfig:
    """Validate the block (None means defaults), then apply the environment overrides."""
    environ = os.environ if environ is None else environ
    if block is None:
        block = {}
    if not isinstance(block, Mapping):
        raise EnvPipeConfigError(f"the 'envpipe' config block must be an object, got {type(block).__name__}")
    values = {k: v for k, v in block.items() if v is not None}
    sources = {k: f"'envpipe.{k}'" for k in values}
    for key, var in ENVIRONMENT.items():
        if environ.get(var):
            values[key], sources[key] = environ[var], var
    try:
        return EnvPipeConfig(**values)
    except ValidationError as exc:
        raise EnvPipeConfigError(_one_line(exc, values, sources)) from None


def _one_line(exc: ValidationError, values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """The first validation error as one line naming where the value came from."""
    err = exc.errors(include_url=False)[0]
    key = str(err["loc"][0]) if err["loc"] else ""
    if err["type"] == "extra_forbidden":
        known = ", ".join(sorted(EnvPipeConfig.model_fields))
        unknown = ", ".join(sorted(set(values) - set(EnvPipeConfig.model_fields)))
        return f"unknown key(s) in 'envpipe' block: {unknown} (known: {known})"
    if not key:  # a rule across fields
        return str(err["msg"]).removeprefix("Value error, ")
    where, value = sources.get(key, f"'envpipe.{key}'"), repr(values[key])
    value = value if len(value) <= 40 else value[:37] + "..."
    if err["type"] == "literal_error":
        choices = str(err["ctx"]["expected"]).replace("'", "").replace(" or ", ", ")
        return f"{where} is {value}; choose one of {choices}"
    message = str(err["msg"])
    return f"{where} is {value}: " + (message.removeprefix("Value error, ") if err["type"] == "value_error"
                                      else message.lower())


def split(ds_config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> tuple[dict, EnvPipeConfig]:
    """(DeepSpeed config without the `envpipe` block, parsed block); the input is not modified."""
    rest = copy.deepcopy(dict(ds_config))
    return rest, parse(rest.pop("envpipe", None), environ)

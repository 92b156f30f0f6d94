"""The `envpipe` block of a DeepSpeed config and the ENVPIPE_* environment variables.

    "envpipe": {"type": "optimal", "scheduling": "envpipe", "max_slowdown": 0.0, "clock": "auto",
                "report_dir": "envpipe-report", "pipeline_stages": 2, "memory_headroom": 0.1, ...}

`type` is the policy: `optimal` (the default: least energy within the time budget, the order chosen
within memory) or EnvPipe's `baseline`, `uniform`, `envelope` (kept for comparison). ENVPIPE_TYPE,
ENVPIPE_SCHEDULING and ENVPIPE_RECONFIGURE override the block, as in EnvPipe; ENVPIPE_CLOCK overrides
`clock` (the launcher's worker pods set it to `daemon` where clockd runs).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from envpipe.plan.policies import POLICIES
from envpipe.plan.reconfig import RECONFIGS

TYPES = ("optimal", *POLICIES)
SCHEDULINGS = ("1f1b", "envpipe")
REPLAN = "replan"  # the optimal policy's reconfiguration: re-plan from measured units until within budget
CLOCKS = ("auto", "sim", "daemon", "none")
STRAGGLERS = ("report", "frontier")
_ENV = {"type": "ENVPIPE_TYPE", "scheduling": "ENVPIPE_SCHEDULING", "reconfig": "ENVPIPE_RECONFIGURE",
        "clock": "ENVPIPE_CLOCK"}
_CHOICES = {"type": TYPES, "scheduling": SCHEDULINGS, "reconfig": (*RECONFIGS, REPLAN), "clock": CLOCKS,
            "straggler": STRAGGLERS}
_STRINGS = ("gpu", "plan", "profile", "report_dir")
_POSITIVE_INTS = ("pipeline_stages", "memory_limit_bytes", "profile_points", "reconfigure_rounds")
_COUNTS = ("compare_iterations",)
_POSITIVE = ("straggler_threshold", "time_budget_s")
_FRACTIONS = ("max_slowdown", "memory_headroom")  # in [0, 1)


class EnvPipeConfigError(ValueError):
    """An invalid `envpipe` block or ENVPIPE_* variable."""


@dataclass(frozen=True)
class EnvPipeConfig:
    type: str = "optimal"
    scheduling: str = "envpipe"  # optimal: may choose EnvPipe's extra warm-up forwards (or 1F1B) within memory
    reconfig: str | None = None  # None: 'replan' for optimal, EnvPipe's 'default' (none) for its policies
    clock: str = "auto"  # sim on CPU; on GPUs the daemon when it answers, else default clocks (said in one line)
    gpu: str | None = None
    plan: str | None = None  # skip profiling and planning: run this plan file
    profile: str | None = None  # skip profiling: plan from this profile CSV
    report_dir: str = "envpipe-report"
    pipeline_stages: int | None = None  # None: one stage per process (no data parallelism)
    straggler: str = "report"  # "frontier": replicas waiting for a straggler take a cheaper plan
    straggler_threshold: float = 0.05  # a replica this much slower than the others' median straggles
    max_slowdown: float | None = None  # budget: the run's own 1F1B all-max iteration times (1 + this)
    time_budget_s: float | None = None  # or an absolute iteration-time budget
    memory_limit_bytes: int | None = None  # per GPU (CPU: the only limit); default on GPUs: the device's memory
    memory_headroom: float = 0.1  # the share of the limit that in-flight activations may not use
    compare_iterations: int = 10  # steady 1F1B all-max iterations interleaved with the plan's, for the report
    profile_points: int = 4  # clocks profiled online
    reconfigure_rounds: int = 5  # most reconfiguration rounds

    @property
    def reconfig_method(self) -> str:
        if self.reconfig is not None:
            return self.reconfig
        return REPLAN if self.type == "optimal" else "default"


def parse(block: Any, environ: Mapping[str, str] | None = None) -> EnvPipeConfig:
    """Validate the block (None means defaults), then apply the environment overrides."""
    environ = os.environ if environ is None else environ
    if block is None:
        block = {}
    if not isinstance(block, Mapping):
        raise EnvPipeConfigError(f"the 'envpipe' config block must be an object, got {type(block).__name__}")
    known = {f.name for f in fields(EnvPipeConfig)}
    unknown = sorted(set(block) - known)
    if unknown:
        raise EnvPipeConfigError(
            f"unknown key(s) in 'envpipe' block: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    values: dict[str, Any] = {k: v for k, v in block.items() if v is not None}
    sources = {k: f"'envpipe.{k}'" for k in values}
    for key, var in _ENV.items():
        if environ.get(var):
            values[key], sources[key] = environ[var], var
    for key, choices in _CHOICES.items():
        if key in values and values[key] not in choices:
            raise EnvPipeConfigError(f"{sources[key]} is {values[key]!r}; choose one of {', '.join(choices)}")
    for key in _STRINGS:
        if key in values and (not isinstance(values[key], str) or not values[key]):
            raise EnvPipeConfigError(f"{sources[key]} must be a non-empty string")
    for key in (*_POSITIVE_INTS, *_COUNTS):
        value = values.get(key)
        low = 1 if key in _POSITIVE_INTS else 0
        if key in values and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise EnvPipeConfigError(f"{sources[key]} must be an integer >= {low}, got {value!r}")
    for key in (*_POSITIVE, *_FRACTIONS):
        value = values.get(key)
        if key not in values:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise EnvPipeConfigError(f"{sources[key]} must be a finite number, got {value!r}")
        if key in _POSITIVE and not value > 0:
            raise EnvPipeConfigError(f"{sources[key]} must be positive, got {value!r}")
        if key in _FRACTIONS and not 0 <= value < 1:
            raise EnvPipeConfigError(f"{sources[key]} must be in [0, 1), got {value!r}")
    if values.get("plan") and values.get("profile"):
        raise EnvPipeConfigError(
            "give either 'plan' (skip profiling and planning) or 'profile' (skip profiling), not both"
        )
    if values.get("max_slowdown") is not None and values.get("time_budget_s") is not None:
        raise EnvPipeConfigError("give either 'max_slowdown' or 'time_budget_s', not both")
    policy = values.get("type", "optimal")
    if values.get("clock") == "none" and policy != "baseline" and not values.get("plan") and not values.get("profile"):
        raise EnvPipeConfigError(
            f"policy '{policy}' plans clocks from a profile, which clock 'none' cannot measure: use clock 'auto', "
            "give 'profile' or 'plan', or use type 'baseline'")
    if values.get("reconfig") == REPLAN and values.get("type", "optimal") != "optimal":
        raise EnvPipeConfigError(f"reconfig '{REPLAN}' re-plans with the optimal planner: it needs type 'optimal'")
    return EnvPipeConfig(**values)


def split(
    ds_config: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[dict, EnvPipeConfig]:
    """(DeepSpeed config without the `envpipe` block, parsed block); the input is not modified."""
    rest = copy.deepcopy(dict(ds_config))
    return rest, parse(rest.pop("envpipe", None), environ)

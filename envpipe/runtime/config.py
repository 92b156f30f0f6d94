"""The `envpipe` block of a DeepSpeed config and the ENVPIPE_* environment variables.

    "envpipe": {"type": "envelope", "scheduling": "envpipe", "reconfig": "default", "gpu": "a100",
                "clock": "auto", "plan": "plan.json", "report_dir": "envpipe-report",
                "pipeline_stages": 2, "straggler": "report", "straggler_threshold": 0.05}

ENVPIPE_TYPE, ENVPIPE_SCHEDULING and ENVPIPE_RECONFIGURE override the block, as in EnvPipe;
ENVPIPE_CLOCK overrides `clock` (the launcher's worker pods set it to `daemon` where clockd runs).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TYPES = ("baseline", "uniform", "envelope")
SCHEDULINGS = ("1f1b", "envpipe")
RECONFIGS = ("default", "greedy", "balanced")
CLOCKS = ("auto", "sim", "daemon", "none")
STRAGGLERS = ("report", "frontier")
_ENV = {"type": "ENVPIPE_TYPE", "scheduling": "ENVPIPE_SCHEDULING", "reconfig": "ENVPIPE_RECONFIGURE",
        "clock": "ENVPIPE_CLOCK"}
_CHOICES = {"type": TYPES, "scheduling": SCHEDULINGS, "reconfig": RECONFIGS, "clock": CLOCKS, "straggler": STRAGGLERS}
_STRINGS = ("gpu", "plan", "profile", "report_dir")
_POSITIVE_INTS = ("pipeline_stages",)
_FRACTIONS = ("straggler_threshold",)


class EnvPipeConfigError(ValueError):
    """An invalid `envpipe` block or ENVPIPE_* variable."""


@dataclass(frozen=True)
class EnvPipeConfig:
    type: str = "envelope"
    scheduling: str = "envpipe"
    reconfig: str = "default"
    clock: str = "auto"  # sim on CPU, daemon on GPUs
    gpu: str | None = None
    plan: str | None = None  # skip profiling and planning: run this plan file
    profile: str | None = None  # skip profiling: plan from this profile CSV
    report_dir: str = "envpipe-report"
    pipeline_stages: int | None = None  # None: one stage per process (no data parallelism)
    straggler: str = "report"  # "frontier": replicas waiting for a straggler take a cheaper plan
    straggler_threshold: float = 0.05  # a replica this much slower than the others' median straggles

    @property
    def policy(self) -> str:
        return self.type


def parse(block: Any, environ: Mapping[str, str] | None = None) -> EnvPipeConfig:
    """Validate the block (None means defaults), then apply the environment overrides."""
    environ = os.environ if environ is None else environ
    if block is None:
        block = {}
    if not isinstance(block, Mapping):
        raise EnvPipeConfigError(f"the 'envpipe' config block must be an object, got {type(block).__name__}")
    known = set(_CHOICES) | set(_STRINGS) | set(_POSITIVE_INTS) | set(_FRACTIONS)
    unknown = sorted(set(block) - known)
    if unknown:
        raise EnvPipeConfigError(
            f"unknown key(s) in 'envpipe' block: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    values: dict[str, Any] = dict(block)
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
    for key in _POSITIVE_INTS:
        value = values.get(key)
        if key in values and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise EnvPipeConfigError(f"{sources[key]} must be a positive integer, got {value!r}")
    for key in _FRACTIONS:
        value = values.get(key)
        if key in values and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
            raise EnvPipeConfigError(f"{sources[key]} must be a positive number, got {value!r}")
    if values.get("plan") and values.get("profile"):
        raise EnvPipeConfigError(
            "give either 'plan' (skip profiling and planning) or 'profile' (skip profiling), not both"
        )
    return EnvPipeConfig(**values)


def split(
    ds_config: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[dict, EnvPipeConfig]:
    """(DeepSpeed config without the `envpipe` block, parsed block); the input is not modified."""
    rest = copy.deepcopy(dict(ds_config))
    return rest, parse(rest.pop("envpipe", None), environ)

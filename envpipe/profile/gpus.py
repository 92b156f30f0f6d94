"""Candidate clocks per GPU, following EnvPipe's per-GPU filters (DeepSpeed runtime/constants.py).

EnvPipe keeps the supported clocks that are multiples of GRANULARITY inside [FILTER_MIN, FILTER_MAX].
Deviation (documented in docs/planner.md): the GPU's highest clock is always a candidate. EnvPipe's
A100 filter drops 1410 MHz (not a multiple of 90), which makes its own "max" 1350 MHz, slower than
the GPU; our baseline and envelope run at the true maximum.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClockFilter:
    max_mhz: int
    min_mhz: int
    granularity: int  # MHz between candidates
    source: str


GPU_FILTERS: dict[str, ClockFilter] = {
    "v100": ClockFilter(1530, 800, 90, "EnvPipe"),
    "rtx3090": ClockFilter(2000, 1100, 90, "EnvPipe"),
    "a100": ClockFilter(1410, 750, 90, "EnvPipe (KISTI fork)"),
    "a6000": ClockFilter(1900, 1700, 90, "EnvPipe (KISTI fork)"),
    # No EnvPipe entry: same 90 MHz pattern down to half the 1980 MHz maximum (our extrapolation).
    "h100": ClockFilter(1980, 990, 90, "extrapolated"),
    "h200": ClockFilter(1980, 990, 90, "extrapolated"),
}
# Blocking (idle) power measured by Perseus's artifact around a blocked dist.recv.
IDLE_POWER_W: dict[str, float] = {"a100": 83.64, "a40": 70.38}
# The profiles shipped in envpipe/profile/data, with the GPU each was measured on.
EMBEDDED_GPUS: dict[str, str] = {"gpt3-175b+a100_sxm_bf16": "a100", "bloom+a40_bf16": "a40",
                                 "bloom+a100_sxm_bf16": "a100", "gpt3-175b+a40_bf16": "a40"}
RECONFIGURE_GRANULARITY_MHZ = 30  # balanced raises by this; greedy by 3x (EnvPipe's constants)
GPU_NAMES = ("all", *GPU_FILTERS, "a40")


def candidate_clocks(supported_mhz: list[int], gpu: str = "all") -> list[int]:
    """Candidate clocks, descending, for ``gpu`` ("all" keeps every supported clock)."""
    supported = sorted({int(f) for f in supported_mhz}, reverse=True)
    if not supported:
        raise ValueError("no supported clocks")
    if gpu == "all" or gpu.lower() == "a40":  # no EnvPipe filter exists for the A40
        return supported
    rule = GPU_FILTERS.get(gpu.lower())
    if rule is None:
        raise ValueError(f"unknown GPU {gpu!r}; choose one of {', '.join(GPU_NAMES)}")
    kept = [f for f in supported if f % rule.granularity == 0 and rule.min_mhz <= f <= rule.max_mhz]
    if supported[0] not in kept:
        kept.insert(0, supported[0])
    return kept

"""Per-iteration energy accounting: unit energies from a counter trace at unit boundaries.

Works on plain (kind, start, end) host-time intervals so that it knows nothing about DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from envpipe.energy.meter import CounterTrace


@dataclass(frozen=True)
class IterationEnergy:
    unit_j: list[float]  # per unit, in the order given
    total_j: float  # the whole iteration [start, end]
    idle_j: float  # total minus the units: waits, bubbles, the tail
    idle_s: float

    def mean(self, kinds: Sequence[str], kind: str) -> float | None:
        values = [e for k, e in zip(kinds, self.unit_j, strict=True) if k == kind]
        return float(np.mean(values)) if values else None

    @property
    def idle_power_w(self) -> float | None:
        return self.idle_j / self.idle_s if self.idle_s > 0 else None


def account(
    trace: CounterTrace, units: Sequence[tuple[float, float]], start: float, end: float
) -> IterationEnergy:
    """Energy of each unit interval (host times) and of the iteration [start, end] around them."""
    if end < start:
        raise ValueError("the iteration ends before it starts")
    bounds = np.asarray(units, float).reshape(-1, 2)
    unit_j = trace.between(bounds[:, 0], bounds[:, 1]) if len(bounds) else np.zeros(0)
    total = float(trace.between(start, end))
    busy_s = float((bounds[:, 1] - bounds[:, 0]).sum()) if len(bounds) else 0.0
    return IterationEnergy(
        [float(x) for x in unit_j], total, total - float(unit_j.sum()), max(0.0, end - start - busy_s)
    )

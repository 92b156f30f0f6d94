"""How far a configuration's predicted time moves with the host's speed: its band, its regime, and which
ranked configurations the host's speed could swap.

Where the host sets the pace (narrow layers, small micro-batches: the host issues a layer's kernels more
slowly than the device runs them, envpipe.search.timing), the iteration takes as long as the host's
issuing, and the host's speed is not the profile's constant: on the lent machines a run's forward units
took one of two times 1.2-1.6 apart (benchmarks/results/search_accuracy_call4.md). A device-bound
configuration does not move with it. So per configuration, with the engine model's host scale k and host
spread s (a machine's constant, fitted on declared runs: benchmarks/search_fit.py):

- ``host_share``: how much of the time the host sets, d ln T / d ln k, from the 1F1B all-max time at
  k (1 - d) and k (1 + d) (d = s, or 10 % where the engine model has no spread): 0 device-bound, 1 every
  unit at the host's pace. ``regime``: launch-bound at a share of at least 1/2, device-bound below 1/10,
  mixed between.
- the band: the 1F1B all-max time at k (1 - s) and k (1 + s), the same for its energy; a planned
  configuration's time and energy scaled by the same ratios (its units are the baseline's, some at lower
  clocks). No spread, no band: low = high.

Two configurations whose bands overlap in the objective's measure are not told apart by the prediction:
the search ranks them by their predicted values and says so (``undecided``) instead of deciding silently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from envpipe.search.evaluate import Candidate, Pipeline, build_pipeline
from envpipe.search.inputs import SearchInputs
from envpipe.search.memory import MemoryTables

LAUNCH_BOUND = 0.5  # host share at or above: the host sets the pace
DEVICE_BOUND = 0.1  # host share below: the device does
PROBE = 0.1  # the host scale's step for the share where the engine model has no spread


@dataclass(frozen=True)
class HostBand:
    """A candidate's predicted time and energy as the host's speed wanders by the engine model's spread."""

    time_s: tuple[float, float]  # (low, high)
    energy_j: tuple[float, float]
    host_share: float  # d ln T / d ln (host time): 0 device-bound ... 1 launch-bound

    @property
    def regime(self) -> str:
        if self.host_share >= LAUNCH_BOUND:
            return "launch-bound"
        return "device-bound" if self.host_share < DEVICE_BOUND else "mixed"

    def to_json(self) -> dict[str, object]:
        return {"time_band_s": list(self.time_s), "energy_band_j": list(self.energy_j),
                "host_share": self.host_share, "regime": self.regime}


def host_band(inputs: SearchInputs, candidate: Candidate) -> HostBand:
    """``candidate``'s band and host share (see the module's docstring)."""
    pipeline, spread = candidate.pipeline, inputs.engine.host_spread
    base_t, base_e = pipeline.baseline_time_s, pipeline.baseline_energy_j
    step = spread if spread > 0 else PROBE
    (t_lo, e_lo), (t_hi, e_hi) = (_baseline(inputs, pipeline, 1 + sign * step) for sign in (-1, 1))
    share = host_share(t_lo, t_hi, base_t, step)
    if spread == 0:
        t_lo = t_hi = base_t
        e_lo = e_hi = base_e
    time, energy = candidate.iteration_time_s, candidate.energy_j
    return HostBand((time * t_lo / base_t, time * t_hi / base_t), (energy * e_lo / base_e, energy * e_hi / base_e),
                    share)


def host_share(low_s: float, high_s: float, time_s: float, step: float) -> float:
    """d ln T / d ln k as a central difference: (T(1 + d) - T(1 - d)) / (2 d T), from the times at host scale
    k (1 - ``step``), k (1 + ``step``) and k."""
    return (high_s - low_s) / (2 * step * time_s)


def _baseline(inputs: SearchInputs, pipeline: Pipeline, factor: float) -> tuple[float, float]:
    """The 1F1B all-max (time, energy of one pipeline) with the host's times ``factor`` times the engine model's."""
    engine = replace(inputs.engine, host_scale=inputs.engine.host_scale * factor)
    shape = pipeline.shape
    tables = MemoryTables(inputs.layers, shape.micro_batch, shape.replicas, shape.microbatches, inputs.graphed)
    moved = build_pipeline(replace(inputs, engine=engine), shape, pipeline.cut, tables)
    return moved.baseline_time_s, moved.baseline_energy_j


def undecided(bands: list[HostBand], by_energy: bool) -> list[int]:
    """The ranks (1-based, from 2) whose band overlaps the first's in the objective's measure: the host's speed
    could put them first."""
    if not bands:
        return []
    first = bands[0].energy_j if by_energy else bands[0].time_s
    ranks = []
    for rank, band in enumerate(bands[1:], 2):
        low, high = band.energy_j if by_energy else band.time_s
        if low <= first[1] and first[0] <= high:
            ranks.append(rank)
    return ranks

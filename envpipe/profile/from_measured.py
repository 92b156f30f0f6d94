"""Stage profiles from measured units: at several clocks (online profiling), or at one clock plus a model.

`profile_from_clocks`: per clock, each stage's measured forward/backward time and energy (the runtime's
online profile, where clocks can be changed). With ``predict_mhz`` every unit is fitted
(`envpipe.profile.clockfit`: power-cap aware, time ``a + b/f``, power ``static + C f V(f)^2``) and the
profile holds every one of those clocks inside the measured range too, so the planner can use every
supported clock; the measured clocks keep their measured numbers. Validated on the Perseus profiles
(benchmarks/results/freqmodel.md).

`profile_from_measured`: where clocks may not be changed (no clock daemon, the lent H200s), only the
default clock can be measured. The other columns are then **simulated**: each is the measured column
scaled by the frequency model's slowdown and busy power at the same fraction of the highest clock (the
model's curve is measured on another GPU, so the result says how this pipeline would plan if its GPU
scaled like that one). How far off that is across GPU kinds was measured (A100 <-> A40):
`envpipe.profile.band.one_clock_band` gives the band to print next to a saving planned this way.

Power cap: under heavy load an H100/H200 already runs below its highest clock (measured on H200: dense
bf16 GEMMs at 1455-1470 MHz of 1980 under the 700 W cap). A lock above that effective clock changes
nothing, so with ``effective_mhz`` the columns at and above a unit's effective clock equal the measured
one, and lower clocks scale from the effective clock, not from the highest. ``effective_mhz`` holds one
entry per stage: a clock (both kinds), a (forward, backward) pair, or None (not measured).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from envpipe.profile.clockfit import fit_curve
from envpipe.profile.csv_profile import Profile
from envpipe.profile.freqmodel import FrequencyModel

EffectiveClocks = Sequence[float | tuple[float | None, float | None] | None]


@dataclass(frozen=True)
class StageUnits:
    """A stage's forward and backward unit at one clock: time (s) and energy (J; nan: not measured)."""

    fwd_s: float
    bwd_s: float
    fwd_j: float = float("nan")
    bwd_j: float = float("nan")


_COLUMNS: tuple[Callable[[StageUnits], float], ...] = (
    lambda u: u.fwd_s, lambda u: u.bwd_s, lambda u: u.fwd_j, lambda u: u.bwd_j)


def profile_from_clocks(
    clocks_mhz: Sequence[int],
    rows: Sequence[Sequence[StageUnits]],
    source: str,
    predict_mhz: Sequence[int] | None = None,
    effective_mhz: EffectiveClocks | None = None,
) -> Profile:
    """A Profile from ``rows[k][s]`` = stage s's units at ``clocks_mhz[k]``.

    ``predict_mhz`` (e.g. every supported clock): add those inside the measured range, fitted from the measured
    clocks (at least two); ``effective_mhz``: per stage, NVML's clock under the units' load at the top clock.
    """
    if not clocks_mhz or len(rows) != len(clocks_mhz) or not rows[0]:
        raise ValueError("need each stage's numbers at each profiled clock")
    if len({int(c) for c in clocks_mhz}) != len(clocks_mhz):
        raise ValueError("each clock may be profiled once")
    S = len(rows[0])
    if any(len(r) != S for r in rows):
        raise ValueError("every profiled clock needs the same stages")

    def table(column: Callable[[StageUnits], float]) -> np.ndarray:
        return np.array([[column(rows[k][s]) for k in range(len(clocks_mhz))] for s in range(S)], float)

    order = np.argsort(-np.asarray(clocks_mhz))
    measured = np.asarray(clocks_mhz, dtype=np.int64)[order]
    f_t, b_t, f_j, b_j = (table(column)[:, order] for column in _COLUMNS)
    if predict_mhz is None:
        return Profile(measured, f_t, b_t, f_j, b_j, source=source)
    if measured.size < 2:
        raise ValueError("fitting other clocks needs at least two profiled clocks")
    lo, hi = int(measured[-1]), int(measured[0])
    clocks = np.array(sorted({int(c) for c in predict_mhz if lo <= int(c) <= hi} | set(measured.tolist()),
                             reverse=True), dtype=np.int64)
    eff = _effective(effective_mhz, S)
    fitted = [np.empty((S, clocks.size)) for _ in range(4)]  # forward time, backward time, their energies
    at_measured = np.searchsorted(-clocks, -measured)
    for s in range(S):
        for backward, times, joules in ((False, f_t, f_j), (True, b_t, b_j)):
            curve = fit_curve(measured, times[s], joules[s], eff[s][backward])
            t, j = curve.time_s(clocks), curve.energy_j(clocks)
            t[at_measured], j[at_measured] = times[s], joules[s]  # measured numbers as measured, bit for bit
            fitted[backward][s], fitted[2 + backward][s] = t, j
    listed = ", ".join(str(int(c)) for c in measured)
    fwd_t, bwd_t, fwd_j, bwd_j = fitted
    return Profile(clocks, fwd_t, bwd_t, fwd_j, bwd_j,
                   source=f"{source}: profiled at {listed} MHz, other clocks fitted (envpipe.profile.clockfit)")


def profile_from_measured(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    fwd_j: Sequence[float],
    bwd_j: Sequence[float],
    clocks_mhz: Sequence[int],
    model: FrequencyModel | None = None,
    effective_mhz: EffectiveClocks | None = None,
) -> Profile:
    """The measured values are each unit's column at its effective clock (default: the highest);
    lower clocks follow ``model``; higher ones equal the measured column (the power cap holds them)."""
    model = model or FrequencyModel.default()
    clocks = np.array(sorted({int(c) for c in clocks_mhz}, reverse=True))
    if clocks.size == 0:
        raise ValueError("no clocks to profile")
    columns = [np.asarray(x, float) for x in (fwd_s, bwd_s, fwd_j, bwd_j)]
    if len({c.shape for c in columns}) != 1 or columns[0].ndim != 1:
        raise ValueError("forward/backward times and energies need one value per stage")
    if any((c <= 0).any() or not np.isfinite(c).all() for c in columns):
        raise ValueError("measured times and energies must be positive")
    S = columns[0].size
    top = float(clocks[0])
    eff = [[top if e is None else min(top, e) for e in pair] for pair in _effective(effective_mhz, S)]

    def on_model(mhz: float) -> int:  # the model's clock at the same fraction of the highest clock
        return model.nearest_clock(model.max_mhz * mhz / top)

    time_scale = np.ones((2, S, clocks.size))  # [kind, stage, clock]
    power_scale = np.ones((2, S, clocks.size))
    for s, pair in enumerate(eff):
        for kind, e in enumerate(pair):
            ref = on_model(e)
            for k, c in enumerate(clocks):
                m = on_model(min(float(c), e))
                time_scale[kind, s, k] = model.time_scale(m) / model.time_scale(ref)
                power_scale[kind, s, k] = model.busy_power(m) / model.busy_power(ref)
    f_t, b_t = (c[:, None] * time_scale[kind] for kind, c in enumerate(columns[:2]))
    f_j, b_j = (c[:, None] * time_scale[kind] * power_scale[kind] for kind, c in enumerate(columns[2:]))
    capped = "" if effective_mhz is None else ", power-capped at the measured effective clocks"
    return Profile(clocks, f_t, b_t, f_j, b_j, source=f"measured at one clock, others simulated{capped}")


def _effective(effective_mhz: EffectiveClocks | None, stages: int) -> list[tuple[float | None, float | None]]:
    """Per stage, the (forward, backward) effective clocks; each a positive number or None."""
    if effective_mhz is None:
        return [(None, None)] * stages
    if len(effective_mhz) != stages:
        raise ValueError(f"effective clocks need one entry per stage ({stages}), got {len(effective_mhz)}")
    pairs = [e if isinstance(e, tuple) else (e, e) for e in effective_mhz]
    for pair in pairs:
        if len(pair) != 2 or any(e is not None and not (np.isfinite(e) and e > 0) for e in pair):
            raise ValueError("an effective clock is a positive number of MHz, a (forward, backward) pair, or None")
    return [(None if f is None else float(f), None if b is None else float(b)) for f, b in pairs]

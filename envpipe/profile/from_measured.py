"""Stage profiles from measured units: at several clocks (online profiling), or at one clock plus a model.

`profile_from_clocks`: per clock, each stage's measured forward/backward time and energy (the runtime's
online profile, where clocks can be changed).

`profile_from_measured`: where clocks may not be changed (no clock daemon, the lent H200s), only the
default clock can be measured. The other columns are then **simulated**: each is the measured column
scaled by the frequency model's slowdown and busy power at the same fraction of the highest clock (the
model's curve is measured on another GPU, so the result says how this pipeline would plan if its GPU
scaled like that one).

Power cap: under heavy load an H100/H200 already runs below its highest clock (measured on H200: dense
bf16 GEMMs at 1455-1470 MHz of 1980 under the 700 W cap). A lock above that effective clock changes
nothing, so with ``effective_mhz`` the columns at and above a stage's effective clock equal the measured
one, and lower clocks scale from the effective clock, not from the highest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envpipe.profile.csv_profile import Profile
from envpipe.profile.freqmodel import FrequencyModel

_COLUMNS = ("F", "B", "F_j", "B_j")


def profile_from_clocks(clocks_mhz: Sequence[int], rows: Sequence[Sequence[dict[str, float]]], source: str) -> Profile:
    """A Profile from ``rows[k][s]`` = stage s's numbers at ``clocks_mhz[k]`` (keys F, B seconds; F_j, B_j joules)."""

    def table(key: str) -> np.ndarray:
        return np.array([[rows[k][s][key] for k in range(len(clocks_mhz))] for s in range(len(rows[0]))], float)

    order = np.argsort(-np.asarray(clocks_mhz))
    f_t, b_t, f_j, b_j = (table(key)[:, order] for key in _COLUMNS)
    return Profile(np.asarray(clocks_mhz)[order], f_t, b_t, f_j, b_j, source=source)


def profile_from_measured(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    fwd_j: Sequence[float],
    bwd_j: Sequence[float],
    clocks_mhz: Sequence[int],
    model: FrequencyModel | None = None,
    effective_mhz: Sequence[float | None] | None = None,
) -> Profile:
    """The measured values are each stage's column at its effective clock (default: the highest);
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
    eff = [top if e is None else min(top, float(e)) for e in (effective_mhz or [None] * S)]
    if len(eff) != S or any(not e > 0 for e in eff):
        raise ValueError("effective clocks need one positive value (or None) per stage")

    def on_model(mhz: float) -> int:  # the model's clock at the same fraction of the highest clock
        return model.nearest_clock(model.max_mhz * mhz / top)

    time_scale = np.ones((S, clocks.size))
    power_scale = np.ones((S, clocks.size))
    for s, e in enumerate(eff):
        ref = on_model(e)
        for k, c in enumerate(clocks):
            m = on_model(min(float(c), e))
            time_scale[s, k] = model.time_scale(m) / model.time_scale(ref)
            power_scale[s, k] = model.busy_power(m) / model.busy_power(ref)
    f_t, b_t = (c[:, None] * time_scale for c in columns[:2])
    f_j, b_j = (c[:, None] * time_scale * power_scale for c in columns[2:])
    capped = "" if effective_mhz is None else ", power-capped at the measured effective clocks"
    return Profile(clocks, f_t, b_t, f_j, b_j, source=f"measured at one clock, others simulated{capped}")

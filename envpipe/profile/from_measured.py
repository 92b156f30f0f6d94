"""A stage profile from unit times and energies measured at one clock, other clocks from a frequency model.

Where clocks may not be changed (the lent H200s), only the default clock can be measured. The other
columns are then **simulated**: each is the measured column scaled by the frequency model's slowdown
and busy power at the same fraction of the highest clock (the model's curve is measured on another
GPU, so the result says how this pipeline would plan if its GPU scaled like that one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envpipe.profile.csv_profile import Profile
from envpipe.profile.freqmodel import FrequencyModel


def profile_from_measured(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    fwd_j: Sequence[float],
    bwd_j: Sequence[float],
    clocks_mhz: Sequence[int],
    model: FrequencyModel | None = None,
) -> Profile:
    """The measured values become the highest clock's column; lower clocks follow ``model``."""
    model = model or FrequencyModel.default()
    clocks = np.array(sorted({int(c) for c in clocks_mhz}, reverse=True))
    if clocks.size == 0:
        raise ValueError("no clocks to profile")
    columns = [np.asarray(x, float) for x in (fwd_s, bwd_s, fwd_j, bwd_j)]
    if len({c.shape for c in columns}) != 1 or columns[0].ndim != 1:
        raise ValueError("forward/backward times and energies need one value per stage")
    if any((c <= 0).any() or not np.isfinite(c).all() for c in columns):
        raise ValueError("measured times and energies must be positive")
    on_model = [model.nearest_clock(model.max_mhz * c / clocks[0]) for c in clocks]
    slow = np.array([model.time_scale(m) for m in on_model])
    power = np.array([model.busy_power(m) / model.busy_power(model.max_mhz) for m in on_model])
    scales = (slow, slow, slow * power, slow * power)
    f_t, b_t, f_j, b_j = (np.outer(c, k) for c, k in zip(columns, scales, strict=True))
    return Profile(clocks, f_t, b_t, f_j, b_j, source="measured at the top clock, others simulated")

"""A profile at more clocks than were measured: linear interpolation in frequency between measured ones.

The runtime's online profile measures a few clocks; online reconfiguration may then raise a unit to
any supported clock in between, and the planner's simulator needs that clock's time and energy to
predict the raised plan. Clocks outside the measured range are refused.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from envpipe.profile.csv_profile import Profile


def with_clocks(profile: Profile, clocks_mhz: Iterable[int]) -> Profile:
    """``profile`` over the union of its clocks and ``clocks_mhz`` (new columns interpolated)."""
    wanted = np.array(sorted({int(f) for f in clocks_mhz} | {int(f) for f in profile.freqs}, reverse=True))
    lo, hi = int(profile.freqs.min()), int(profile.freqs.max())
    outside = wanted[(wanted < lo) | (wanted > hi)]
    if outside.size:
        raise ValueError(f"{profile.source}: cannot interpolate to {outside.tolist()} MHz outside {lo}..{hi} MHz")
    x = profile.freqs[::-1].astype(float)  # ascending for np.interp

    def table(t: np.ndarray) -> np.ndarray:
        return np.array([np.interp(wanted, x, row[::-1]) for row in t])

    return Profile(
        wanted,
        table(profile.fwd_time),
        table(profile.bwd_time),
        table(profile.fwd_energy),
        table(profile.bwd_energy),
        f"{profile.source} (interpolated)",
    )

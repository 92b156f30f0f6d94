"""How far off the one-clock path can be: the band to print next to a saving planned from one measured clock.

Where clocks cannot be changed, the profile's lower clocks come from another GPU's curve
(`envpipe.profile.from_measured.profile_from_measured`). benchmarks/freqmodel_validate.py measured what
that costs across GPU kinds: each Perseus profile's curve (A100 or A40) applied to the top-clock column of
the profiles of the *other* GPU kind, against what that GPU measured at every clock. The band is the
lowest and highest relative error, (predicted - measured) / measured, of a unit's time and energy over
every such pair, stage, unit kind and clock at or above a fraction of the highest clock
(envpipe/profile/data/one_clock_band.json, written by that script; benchmarks/results/freqmodel.md).

It is an A100 <-> A40 number: whether an H100 or H200 departs from the A100 curve by as much is not
validated (clocks cannot be changed on the lent GPUs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

BAND_PATH = Path(__file__).parent / "data" / "one_clock_band.json"


@dataclass(frozen=True)
class OneClockBand:
    """The measured cross-GPU error range of the one-clock path for units down to ``min_fraction`` of the top clock."""

    min_fraction: float
    time: tuple[float, float]  # (low, high) of (predicted - measured) / measured of a unit's time
    energy: tuple[float, float]  # the same for a unit's energy

    def saving_range(self, saving: float, lowered_share: float) -> tuple[float, float]:
        """(low, high) of the true saving, given the predicted one and the share of the plan's predicted energy
        that its units below the top clock draw (the rest, top-clock units and blocking, is as measured).

        A lowered unit predicted at E has true energy E / (1 + e) for e in the band, every such unit erring
        alike (the error is the GPU's curve, shared by its units). The time band is not folded in: a plan
        slower than predicted shows as a time error, not as a different saving.
        """
        if not 0.0 <= lowered_share <= 1.0:
            raise ValueError(f"the lowered units' share of the energy is in [0, 1], got {lowered_share!r}")
        ends = [1.0 - (1.0 - saving) * (1.0 - lowered_share + lowered_share / (1.0 + e)) for e in self.energy]
        return min(ends), max(ends)


@cache
def _rows(path: Path) -> tuple[OneClockBand, ...]:
    raw = json.loads(path.read_text())
    rows = [OneClockBand(float(r["min_fraction"]), (float(r["time"][0]), float(r["time"][1])),
                         (float(r["energy"][0]), float(r["energy"][1]))) for r in raw["rows"]]
    return tuple(sorted(rows, key=lambda r: -r.min_fraction))


def one_clock_band(lowest_mhz: float, top_mhz: float, path: Path = BAND_PATH) -> OneClockBand | None:
    """The band for a plan whose lowest clock is ``lowest_mhz`` on a GPU whose units' top clock is ``top_mhz``
    (the effective clock where measured); None below the lowest fraction validated."""
    if not (top_mhz > 0 and lowest_mhz > 0):
        raise ValueError("clocks are positive numbers of MHz")
    fraction = lowest_mhz / top_mhz
    if fraction >= 1.0:
        return OneClockBand(1.0, (0.0, 0.0), (0.0, 0.0))  # nothing below the measured clock: nothing modelled
    return next((row for row in _rows(path) if row.min_fraction <= fraction + 1e-12), None)

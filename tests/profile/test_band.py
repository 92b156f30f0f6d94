"""The one-clock band (envpipe.profile.band): which row a plan gets, the saving range, and that the shipped
band is what the committed validation results say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envpipe.profile import OneClockBand, one_clock_band
from envpipe.profile.band import BAND_PATH

ROOT = Path(__file__).resolve().parents[2]


def test_rows_cover_the_plans_lowest_clock() -> None:
    rows = json.loads(BAND_PATH.read_text())["rows"]
    by_fraction = {r["min_fraction"]: r for r in rows}
    band = one_clock_band(1425, 1980)  # 0.72 of the top: the row for clocks down to 0.70
    assert band is not None and band.min_fraction == 0.7
    assert list(band.energy) == by_fraction[0.7]["energy"] and list(band.time) == by_fraction[0.7]["time"]
    assert one_clock_band(1386, 1980).min_fraction == 0.7  # exactly 0.70
    assert one_clock_band(980, 1980) is None  # below half the top clock nothing was validated
    assert one_clock_band(1980, 1980) == OneClockBand(1.0, (0.0, 0.0), (0.0, 0.0))  # nothing modelled


def test_band_widens_as_clocks_go_lower() -> None:
    bands = [one_clock_band(1980 * f, 1980) for f in (0.95, 0.85, 0.75, 0.6)]
    assert all(b is not None for b in bands)
    lows = [b.energy[0] for b in bands if b is not None]
    highs = [b.energy[1] for b in bands if b is not None]
    assert lows == sorted(lows, reverse=True) and highs == sorted(highs)


def test_saving_range_worked_numbers() -> None:
    """Predicted saving 10 %, half the plan's energy in lowered units, unit energy off by -20 % .. +10 %:
    true lowered energy 1/0.8 or 1/1.1 of predicted, so the true saving is
    1 - 0.9 (0.5 + 0.5/0.8) = -1.25 % .. 1 - 0.9 (0.5 + 0.5/1.1) = +14.09 %."""
    band = OneClockBand(0.7, (-0.1, 0.1), (-0.2, 0.1))
    low, high = band.saving_range(0.10, 0.5)
    assert low == pytest.approx(-0.0125) and high == pytest.approx(1 - 0.9 * (0.5 + 0.5 / 1.1))
    assert band.saving_range(0.10, 0.0) == pytest.approx((0.10, 0.10))  # nothing lowered, nothing uncertain
    with pytest.raises(ValueError, match=r"share of the energy is in \[0, 1\]"):
        band.saving_range(0.1, 1.5)


def test_bad_clocks_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        one_clock_band(0, 1980)


def test_shipped_band_is_the_committed_validation_results() -> None:
    """envpipe/profile/data/one_clock_band.json holds exactly the rows the committed raw results give."""
    from benchmarks.freqmodel_validate import band_file, band_rows

    raw = json.loads((ROOT / "benchmarks/results/freqmodel.json").read_text())
    assert band_rows(raw) == raw["band"]
    assert json.loads(BAND_PATH.read_text()) == band_file(raw)

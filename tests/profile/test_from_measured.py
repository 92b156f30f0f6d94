"""Profiles from measured units (envpipe.profile.from_measured): profiled clocks with every other clock fitted,
and the one-clock path with per-unit effective clocks."""

from __future__ import annotations

import numpy as np
import pytest

from envpipe.profile import FrequencyModel, Profile, fit_curve
from envpipe.profile.from_measured import StageUnits, profile_from_clocks, profile_from_measured


def rows_of(profile: Profile, clocks: list[int]) -> list[list[StageUnits]]:
    """What the runtime's profile phase hands over: per profiled clock, per stage, F/B seconds and joules."""
    out = []
    for c in clocks:
        k = profile.freq_index(c)
        out.append([StageUnits(float(profile.fwd_time[s, k]), float(profile.bwd_time[s, k]),
                                float(profile.fwd_energy[s, k]), float(profile.bwd_energy[s, k]))
                    for s in range(profile.num_stages)])
    return out


def test_profiled_clocks_only_without_predict(gpt3: Profile) -> None:
    clocks = [1035, 1410, 855, 1230]  # any order: the profile sorts them
    p = profile_from_clocks(clocks, rows_of(gpt3, clocks), "online")
    assert p.freqs.tolist() == [1410, 1230, 1035, 855] and p.source == "online"
    np.testing.assert_array_equal(p.fwd_time, gpt3.restricted(clocks).fwd_time)


def test_every_supported_clock_in_range_from_four_profiled(gpt3: Profile) -> None:
    clocks = [1410, 1230, 1035, 855]
    supported = [1500, *gpt3.freqs.tolist(), 800]  # a clock above and one below the profiled range
    p = profile_from_clocks(clocks, rows_of(gpt3, clocks), "online", predict_mhz=supported)
    assert p.freqs.tolist() == gpt3.freqs.tolist()  # 1500 and 800 lie outside the measured range: not predicted
    assert "profiled at 1410, 1230, 1035, 855 MHz" in p.source and "fitted" in p.source
    for c in clocks:  # the measured numbers, bit for bit
        k = p.freq_index(c)
        assert p.fwd_time[:, k].tolist() == gpt3.fwd_time[:, k].tolist()
        assert p.bwd_energy[:, k].tolist() == gpt3.bwd_energy[:, k].tolist()
    # every other clock is the unit's fitted curve
    curve = fit_curve(clocks, [gpt3.time("B", 7, gpt3.freq_index(c)) for c in clocks],
                      [gpt3.energy("B", 7, gpt3.freq_index(c)) for c in clocks])
    k = p.freq_index(1125)
    assert p.bwd_time[7, k] == pytest.approx(float(curve.time_s(1125)), rel=1e-12)
    assert p.bwd_energy[7, k] == pytest.approx(float(curve.energy_j(1125)), rel=1e-12)
    # and close to what the GPU measured there (benchmarks/results/freqmodel.md has every clock)
    assert p.bwd_time[7, k] == pytest.approx(gpt3.bwd_time[7, k], rel=0.01)


def test_effective_clocks_per_stage_and_kind_hold_the_units_flat(gpt3: Profile) -> None:
    clocks = [1410, 1230, 1035, 855]
    p = profile_from_clocks(clocks, rows_of(gpt3, clocks), "online", predict_mhz=gpt3.freqs.tolist(),
                            effective_mhz=[(1305, None), *[None] * 7])
    above = [p.freq_index(c) for c in (1395, 1350, 1305)]  # predicted clocks at or above stage 0 F's cap
    assert np.ptp(p.fwd_time[0, above]) == 0 and np.ptp(p.fwd_energy[0, above]) == 0
    assert np.ptp(p.bwd_time[0, above]) > 0  # the backward has no cap given: it keeps scaling


@pytest.mark.parametrize(
    ("effective", "reason"),
    [([1300.0], "one entry per stage"), ([1300.0, -1.0], "positive number"), ([(1300.0,), None], "pair")],
)
def test_bad_effective_clocks_are_refused(effective, reason) -> None:
    rows = [[StageUnits(1.0, 2.0, 3.0, 4.0)] * 2] * 2
    with pytest.raises(ValueError, match=reason):
        profile_from_clocks([1410, 855], rows, "x", predict_mhz=[1410, 1200, 855], effective_mhz=effective)


def test_one_profiled_clock_cannot_be_fitted() -> None:
    with pytest.raises(ValueError, match="at least two profiled clocks"):
        profile_from_clocks([1410], [[StageUnits(1.0, 2.0, 3.0, 4.0)]], "x", predict_mhz=[1410, 855])


def test_one_clock_path_per_kind_effective_clocks(gpt3: Profile) -> None:
    """profile_from_measured: a (forward, backward) pair per stage caps each kind at its own clock; a plain number
    caps both, as before."""
    model = FrequencyModel.default()
    clocks = gpt3.freqs.tolist()
    top = [gpt3.fwd_time[:, 0], gpt3.bwd_time[:, 0], gpt3.fwd_energy[:, 0], gpt3.bwd_energy[:, 0]]
    f_t, b_t, f_j, b_j = (x.tolist() for x in top)
    pair = profile_from_measured(f_t, b_t, f_j, b_j, clocks, model, effective_mhz=[(1200, 1350)] * 8)
    k1200, k1350, k1000 = (pair.freq_index(c) for c in (1200, 1350, 1005))
    assert pair.fwd_time[0, 0] == pair.fwd_time[0, k1200] == f_t[0]  # flat down to the forward's cap
    assert pair.bwd_time[0, 0] == pair.bwd_time[0, k1350] == b_t[0]
    assert pair.bwd_time[0, k1200] > b_t[0]  # the backward scales below 1350 MHz
    # below its cap a unit scales as the model does from the model's clock at the cap's fraction of the top
    ratio = model.time_scale(1005) / model.time_scale(1200)
    assert pair.fwd_time[0, k1000] == pytest.approx(f_t[0] * ratio)
    single = profile_from_measured(f_t, b_t, f_j, b_j, clocks, model, effective_mhz=[1200] * 8)
    both = profile_from_measured(f_t, b_t, f_j, b_j, clocks, model, effective_mhz=[(1200, 1200)] * 8)
    np.testing.assert_array_equal(single.bwd_energy, both.bwd_energy)
    assert "power-capped" in single.source

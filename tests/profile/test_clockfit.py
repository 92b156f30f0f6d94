"""The fitted frequency model (envpipe.profile.clockfit): worked numbers, the power cap, anchoring, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from envpipe.profile import fit_curve, profile_clocks

# A unit with a known curve: time a + b/x, power p0 + p3 x^3 with x = min(f, 1350) / 1410
A, B, P0, P3, CAP, TOP = 0.010, 0.040, 150.0, 300.0, 1350.0, 1410.0
CLOCKS = np.arange(1410, 854, -15, dtype=float)


def known(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.minimum(f, CAP) / TOP
    t = A + B / x
    return t, t * (P0 + P3 * x**3)


def test_profile_clocks_spread_from_the_highest_to_the_lowest() -> None:
    supported = [int(f) for f in CLOCKS]  # 38 clocks, 1410 .. 855
    assert profile_clocks(supported, 4) == [1410, 1230, 1035, 855]  # indices 0, 12, 25, 37
    assert profile_clocks(supported[::-1], 2) == [1410, 855]
    assert profile_clocks([1410, 1395], 4) == [1410, 1395]
    assert profile_clocks(supported, 1) == [1410]


def test_recovers_a_known_curve_and_its_cap_from_four_clocks() -> None:
    profiled = np.array(profile_clocks(list(CLOCKS), 4), float)
    t, e = known(profiled)
    curve = fit_curve(profiled, t, e)
    assert curve.cap_mhz == CAP  # on the 15 MHz grid between the two highest profiled clocks
    assert curve.time_coef == pytest.approx((A, B), rel=1e-9)
    assert curve.power_coef == pytest.approx((P0, 0.0, P3), rel=1e-9, abs=1e-9)
    want_t, want_e = known(CLOCKS)
    np.testing.assert_allclose(curve.time_s(CLOCKS), want_t, rtol=1e-9)
    np.testing.assert_allclose(curve.energy_j(CLOCKS), want_e, rtol=1e-9)
    # worked: at 1000 MHz x = 1000/1410, t = 0.01 + 0.04 * 1.41 = 0.0664 s, P = 150 + 300 x^3 = 257.03 W
    assert float(curve.time_s(1000)) == pytest.approx(0.0664)
    assert float(curve.power_w(1000)) == pytest.approx(150 + 300 * (1000 / 1410) ** 3)
    # flat above the cap: asking for more than the power cap allows changes nothing
    assert float(curve.time_s(1400)) == pytest.approx(float(curve.time_s(1350)))
    assert float(curve.power_w(1400)) == pytest.approx(float(curve.power_w(1350)))


def test_no_cap_when_the_top_keeps_scaling() -> None:
    f = np.array([1410.0, 1230, 1035, 855])
    t = 0.01 + 0.04 * TOP / f
    curve = fit_curve(f, t, t * (100 + 300 * (f / TOP) ** 3))
    assert curve.cap_mhz == TOP


def test_effective_clock_from_nvml_sets_the_cap() -> None:
    """The clock under the unit's load at the top clock (NVML) is the cap: flat above it, fitted below."""
    f = np.array([1410.0, 1230, 1035, 855])
    t, e = known(f)
    curve = fit_curve(f, t, e, effective_mhz=1300)
    assert curve.cap_mhz == 1300
    assert float(curve.time_s(1410)) == pytest.approx(float(curve.time_s(1300)))
    assert float(curve.time_s(1300)) > float(curve.time_s(1410)) * (1 - 1e-12)
    # an effective clock above the top profiled clock is no cap at all; below the lowest, the lowest
    assert fit_curve(f, t, e, effective_mhz=2000).cap_mhz == TOP
    assert fit_curve(f, t, e, effective_mhz=500).cap_mhz == 855


def test_anchored_through_every_measurement_and_physical_between() -> None:
    """Measurements off the form (noise) are reproduced exactly below the cap; those above it ran at the cap, so
    the curve holds their mean there. Between them the curve keeps the form's direction: slower and lower power
    at lower clocks."""
    rng = np.random.default_rng(7)
    f = np.array([1740.0, 1440, 1155, 990, 855])
    t, e = known(f)
    t, e = t * (1 + 0.01 * rng.standard_normal(5)), e * (1 + 0.01 * rng.standard_normal(5))
    curve = fit_curve(f, t, e)
    below = f < curve.cap_mhz
    assert below.tolist() == [False, False, True, True, True]
    np.testing.assert_allclose(curve.time_s(f[below]), t[below], rtol=1e-12)
    np.testing.assert_allclose(curve.energy_j(f[below]), e[below], rtol=1e-12)
    p = e / t
    assert float(curve.time_s(1740)) == pytest.approx(float(np.mean(t[:2])), rel=1e-12)
    assert float(curve.power_w(1600)) == pytest.approx(float(np.mean(p[:2])), rel=1e-12)
    dense = np.arange(855.0, 1741.0, 15.0)
    assert (np.diff(curve.time_s(dense)) <= 1e-12).all()
    assert (np.diff(curve.power_w(dense)) >= -1e-9).all()


def test_two_clocks_fit_exactly_with_the_cubic_power() -> None:
    f = np.array([1410.0, 855])
    t = np.array([0.05, 0.08])
    p = np.array([400.0, 200.0])
    curve = fit_curve(f, t, t * p)
    assert curve.cap_mhz == TOP
    np.testing.assert_allclose(curve.time_s(f), t)
    assert curve.power_coef[1] == 0.0 and curve.power_coef[2] > 0  # static + cubic, not linear


def test_a_unit_that_does_not_scale_stays_flat() -> None:
    """A memory-bound unit (no faster at a higher clock): constant time, never negative coefficients."""
    f = np.array([1410.0, 1230, 1035, 855])
    t = np.array([0.050, 0.0501, 0.0499, 0.0502])
    curve = fit_curve(f, t, t * 200)
    assert min(curve.time_coef) >= 0 and min(curve.power_coef[1:]) >= 0
    np.testing.assert_allclose(curve.time_s(CLOCKS), 0.05, rtol=0.01)


@pytest.mark.parametrize(
    ("clocks", "times", "energies", "effective", "reason"),
    [
        ([1410], [0.1], [10.0], None, "at least two profiled clocks"),
        ([1410, 1410], [0.1, 0.1], [10.0, 10.0], None, "profiled once"),
        ([1410, 855], [0.1, 0.0], [10.0, 5.0], None, "must be positive"),
        ([1410, 855], [0.1, float("nan")], [10.0, 5.0], None, "must be finite"),
        ([1410, 855], [0.1], [10.0, 5.0], None, "one value each"),
        ([1410, 855], [0.1, 0.2], [10.0, 5.0], -5.0, "positive number of MHz"),
    ],
)
def test_bad_input_is_one_clear_error(clocks, times, energies, effective, reason) -> None:
    with pytest.raises(ValueError, match=reason):
        fit_curve(clocks, times, energies, effective_mhz=effective)


def test_no_prediction_below_the_lowest_profiled_clock() -> None:
    curve = fit_curve([1410, 1035], [0.05, 0.07], [20.0, 18.0])
    with pytest.raises(ValueError, match="below the lowest profiled clock"):
        curve.time_s([1200, 900])

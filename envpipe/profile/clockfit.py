"""A unit's time and power at every SM clock, fitted from the few clocks the runtime profiled.

Online profiling measures each stage's forward and backward units at a handful of clocks
(`profile_clocks`); the planner wants every supported clock. `fit_curve` fits one unit (a stage's
forward or backward) with a physical form and `ClockCurve` predicts it at any clock in the measured range.

The form, and why:

- **Power cap.** A unit runs at ``f_a = min(f, cap)``: asked for more than the clock its own load allows
  under the power cap, the GPU holds ``cap`` (measured on H100: dense bf16 GEMMs at 1395 MHz of 1980), so
  time and power are flat above it. ``cap`` is NVML's clock under the unit's load when the runtime measured
  it (``effective_mhz``), else fitted: the clock, at or above the third-highest profiled one, that explains
  both curves best (A40 units flatten around 1450-1500 MHz of 1740); at most the two highest profiled clocks
  ran capped, so three distinct clocks are left to fit the power.
- **Time** ``t = a + b / f_a``: ``b / f`` is the work that scales with the SM clock (math, on-chip data
  movement), ``a`` the part that does not (HBM traffic on the memory clock, launches, communication).
  ``a, b >= 0``: a unit never gets faster at a lower clock, nor slower than in proportion to it.
- **Power** ``P = p0 + p1 f_a + p3 f_a^3`` is ``static + C f V(f)^2`` with ``V(f)^2 = V0^2 + k f^2``: dynamic
  power is ``C f V^2``, and the driver's voltage curve is flat near its floor at low clocks (power about
  linear in f) and rises with the clock at high ones (about cubic); ``p0`` is the static draw (memory,
  board, leakage). All coefficients ``>= 0``: power never falls as the clock rises.

Both are fitted by least squares on relative residuals (the clock normalised by the highest profiled one);
then the curve is **anchored**: scaled by the ratio measured / fitted, interpolated linearly between the
profiled clocks, so it passes through every measurement below the cap (those above it ran at the cap: their
mean) and only the shape between them is the model's.
Validated against the Perseus profiles (measured at every clock; benchmarks/freqmodel_validate.py,
results in benchmarks/results/freqmodel.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

CAP_STEP_MHZ = 15.0  # resolution of the fitted cap (NVIDIA GPUs step their clocks by 15 MHz)


def profile_clocks(supported_mhz: Sequence[int], count: int) -> list[int]:
    """`count` clocks spread evenly over the supported ones, from the highest to the lowest (the clocks the
    runtime's online profile measures)."""
    clocks = sorted({int(f) for f in supported_mhz}, reverse=True)
    if count < 2 or len(clocks) <= count:
        return clocks[: max(1, count)]
    return [clocks[round(i * (len(clocks) - 1) / (count - 1))] for i in range(count)]


@dataclass(frozen=True)
class ClockCurve:
    """One unit's time (s) and power (W) as functions of the requested SM clock (MHz), in the profiled range.

    Coefficients are on the normalised clock ``x = min(f, cap) / top_mhz``: time ``a + b / x``, power
    ``p0 + p1 x + p3 x^3``, each times its anchor ratio (measured / fitted, linear in ``min(f, cap)`` between
    the profiled clocks, so the curve stays flat above the cap).
    """

    top_mhz: float  # the highest profiled clock
    low_mhz: float  # the lowest profiled clock: the curve does not extrapolate below it
    cap_mhz: float  # the clock the unit runs at when asked for more (<= top_mhz)
    time_coef: tuple[float, float]  # a, b (s)
    power_coef: tuple[float, float, float]  # p0, p1, p3 (W)
    anchor_mhz: tuple[float, ...]  # the clocks the profiled units ran at (min(profiled, cap)), ascending
    time_ratio: tuple[float, ...]  # measured / fitted time at each (the mean where several ran at the cap)
    power_ratio: tuple[float, ...]  # measured / fitted power at each

    def _x(self, mhz: float | np.ndarray) -> np.ndarray:
        f = np.asarray(mhz, float)
        if (f < self.low_mhz - 1e-9).any():
            raise ValueError(f"{float(np.min(f)):g} MHz is below the lowest profiled clock ({self.low_mhz:g} MHz)")
        return np.minimum(f, self.cap_mhz) / self.top_mhz

    def _ratio(self, mhz: float | np.ndarray, ratios: tuple[float, ...]) -> np.ndarray:
        return np.interp(np.minimum(np.asarray(mhz, float), self.cap_mhz), self.anchor_mhz, ratios)

    def time_s(self, mhz: float | np.ndarray) -> np.ndarray:
        a, b = self.time_coef
        return (a + b / self._x(mhz)) * self._ratio(mhz, self.time_ratio)

    def power_w(self, mhz: float | np.ndarray) -> np.ndarray:
        x = self._x(mhz)
        p0, p1, p3 = self.power_coef
        return (p0 + p1 * x + p3 * x**3) * self._ratio(mhz, self.power_ratio)

    def energy_j(self, mhz: float | np.ndarray) -> np.ndarray:
        return self.time_s(mhz) * self.power_w(mhz)


def fit_curve(
    clocks_mhz: ArrayLike, times_s: ArrayLike, energies_j: ArrayLike, effective_mhz: float | None = None
) -> ClockCurve:
    """Fit one unit from its measurements at two or more distinct clocks.

    ``effective_mhz``: the clock NVML saw under this unit's load at the highest profiled clock (the power
    cap's); without it the cap is fitted (see the module's docstring).
    """
    f, t, e = (np.asarray(v, float) for v in (clocks_mhz, times_s, energies_j))
    if not (f.ndim == 1 and f.shape == t.shape == e.shape):
        raise ValueError("clocks, times and energies need one value each per profiled clock")
    if not (np.isfinite(f).all() and np.isfinite(t).all() and np.isfinite(e).all()):
        raise ValueError("profiled clocks, times and energies must be finite")
    if (f <= 0).any() or (t <= 0).any() or (e <= 0).any():
        raise ValueError("profiled clocks, times and energies must be positive")
    if np.unique(f).size != f.size:
        raise ValueError("each clock may be profiled once")
    if f.size < 2:
        raise ValueError("a fit needs at least two profiled clocks (one clock: envpipe.profile.from_measured)")
    order = np.argsort(f)
    f, t, e = f[order], t[order], e[order]
    p = e / t
    top = float(f[-1])
    if effective_mhz is not None:
        if not (np.isfinite(effective_mhz) and effective_mhz > 0):
            raise ValueError(f"an effective clock must be a positive number of MHz, got {effective_mhz!r}")
        caps = [float(np.clip(effective_mhz, f[0], top))]
    elif f.size >= 3:  # at most the two highest profiled clocks ran capped (or none did)
        caps = list(np.arange(top, (f[-3] if f.size >= 4 else f[-2]) + CAP_STEP_MHZ / 2, -CAP_STEP_MHZ))
    else:  # two clocks cannot place a cap
        caps = [top]
    best: tuple[float, float, np.ndarray, np.ndarray] | None = None
    for cap in caps:  # from the top down: a lower cap must fit strictly better
        x = np.minimum(f, cap) / top
        time_coef, time_sse = _fit_time(x, t)
        power_coef, power_sse = _fit_power(x, p)
        if best is None or time_sse + power_sse < best[0] - 1e-12:
            best = (time_sse + power_sse, cap, time_coef, power_coef)
    assert best is not None
    _, cap, time_coef, power_coef = best
    ran = np.minimum(f, cap)  # the clock each measurement actually ran at
    x = ran / top
    time_ratio = t / (time_coef[0] + time_coef[1] / x)
    power_ratio = p / (power_coef[0] + power_coef[1] * x + power_coef[2] * x**3)
    anchors = np.unique(ran)  # measurements above the cap ran at the same clock: their mean ratio anchors it
    return ClockCurve(top, float(f[0]), float(cap), (float(time_coef[0]), float(time_coef[1])),
                      (float(power_coef[0]), float(power_coef[1]), float(power_coef[2])),
                      tuple(float(v) for v in anchors),
                      tuple(float(np.mean(time_ratio[ran == a])) for a in anchors),
                      tuple(float(np.mean(power_ratio[ran == a])) for a in anchors))


def _fit_time(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float]:
    """(a, b) of t = a + b/x with a, b >= 0, least squares on relative residuals; and the residual."""
    return _nonnegative_fit(np.stack([np.ones_like(x), 1 / x], axis=1), t, np.unique(x).size, _TIME_TERMS)


def _fit_power(x: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, float]:
    """(p0, p1, p3) of P = p0 + p1 x + p3 x^3, all >= 0; and the residual."""
    return _nonnegative_fit(np.stack([np.ones_like(x), x, x**3], axis=1), p, np.unique(x).size, _POWER_TERMS)


# The subsets of terms a fit may use, in order of preference where two fit equally well (two clocks fit any
# two terms exactly): time scales with 1/f before it is constant; power keeps its static part and grows with
# the cube of the clock (voltage rising with it) before linearly.
_TIME_TERMS = ((0, 1), (1,), (0,))
_POWER_TERMS = ((0, 1, 2), (0, 2), (0, 1), (0,))


def _nonnegative_fit(basis: np.ndarray, y: np.ndarray, distinct: int, subsets: tuple[tuple[int, ...], ...]
                     ) -> tuple[np.ndarray, float]:
    """Least squares of ``basis @ c ~ y`` on relative residuals with every coefficient >= 0: the feasible subset
    of terms (no more terms than ``distinct`` points) of least residual. Exact for so few terms, and no
    optimiser dependency. The constant term alone is always feasible for positive data."""
    scaled = basis / y[:, None]
    best: tuple[float, np.ndarray] | None = None
    for terms in subsets:
        if len(terms) > distinct:
            continue
        sub, *_ = np.linalg.lstsq(scaled[:, terms], np.ones_like(y), rcond=None)
        coef = np.zeros(basis.shape[1])
        coef[list(terms)] = sub
        if (coef < 0).any() or not (basis @ coef > 0).all():
            continue
        sse = float(np.sum((basis @ coef / y - 1) ** 2))
        if best is None or sse < best[0] - 1e-15:
            best = (sse, coef)
    assert best is not None, "a constant fits any positive data"
    return best[1], best[0]

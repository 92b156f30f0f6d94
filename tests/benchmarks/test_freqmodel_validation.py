"""The frequency-model validation (benchmarks/freqmodel_validate.py) and its rendering (freqmodel_results.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import freqmodel_results as results
from benchmarks import freqmodel_validate as validate
from envpipe.profile import Profile, fit_curve, profile_clocks

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "benchmarks/results/freqmodel.json"


def cut(profile: Profile, clocks: int = 12, stages: int = 2) -> Profile:
    """A small profile: every third clock from the top, the first ``stages`` stages (real measured numbers)."""
    return profile.restricted(profile.freqs[: 3 * clocks : 3].tolist()).with_stages(stages)


def test_renderer_reproduces_the_committed_table() -> None:
    raw = json.loads(RAW.read_text())
    assert results.render(raw) == (ROOT / "benchmarks/results/freqmodel.md").read_text()


def test_validation_on_a_cut_down_profile(bloom: Profile, gpt3: Profile) -> None:
    """Profiled clocks by the runtime's rule; the error is zero where measured and, elsewhere, the fitted curve
    against the measurement; the summary rows and the one-clock band come out of the same numbers."""
    small = cut(bloom)  # 1740 .. 1245 MHz in 45 MHz steps, 2 stages
    raw_profile = validate.validate_profile("small-a40", "-", "A40", small, points=4)
    assert raw_profile["profiled_mhz"] == profile_clocks(small.freqs.tolist(), 4) == [1740, 1560, 1425, 1245]
    assert len(raw_profile["units"]) == 4  # 2 stages x (F, B)
    k = small.freqs.tolist().index(1290)
    for unit in raw_profile["units"]:
        t_err, e_err = results.errors(unit, unit)
        profiled = np.isin(raw_profile["clocks_mhz"], raw_profile["profiled_mhz"])
        assert np.abs(t_err[profiled]).max() < 1e-6 and np.abs(e_err[profiled]).max() < 1e-6
        assert np.abs(t_err[~profiled]).max() < 0.1 and np.abs(e_err[~profiled]).max() < 0.1
        times = small.fwd_time if unit["kind"] == "F" else small.bwd_time
        joules = small.fwd_energy if unit["kind"] == "F" else small.bwd_energy
        idx = [small.freq_index(c) for c in raw_profile["profiled_mhz"]]
        curve = fit_curve(small.freqs[idx], times[unit["stage"], idx], joules[unit["stage"], idx])
        assert unit["cap_mhz"] == curve.cap_mhz
        assert t_err[k] == pytest.approx(float(curve.time_s(1290)) / times[unit["stage"], k] - 1, abs=1e-6)

    a100 = cut(gpt3, clocks=10)
    raw = {"points": 4, "profiles": [raw_profile, validate.validate_profile("small-a100", "-", "A100", a100, 4)],
           "one_clock": validate.one_clock_pairs({"small-a40": ("A40", small), "small-a100": ("A100", a100)}),
           "sweep": validate.sweep("small-a40", small, (3, 4))}
    assert [(p["reference"], p["target"]) for p in raw["one_clock"]] == [("small-a40", "small-a100"),
                                                                           ("small-a100", "small-a40")]
    raw["band"] = validate.band_rows(raw)
    assert raw["band"][0]["min_fraction"] == 0.95
    lows = [r["energy"][0] for r in raw["band"]]
    assert lows == sorted(lows, reverse=True)  # a lower clock only adds errors
    lines = results.summary(raw)
    assert lines[-2].startswith("| small-a40 | A40 | 1740, 1560, 1425, 1245 | 8 |")
    assert [r["points"] for r in raw["sweep"]] == [3, 4]


def test_json_one_unit_per_line() -> None:
    text = validate.dump({"a": 1, "rows": [{"x": [1.0, 2.0]}, {"x": [3.0]}]})
    assert text == '{\n "a": 1,\n "rows": [\n  {"x": [1.0, 2.0]},\n  {"x": [3.0]}\n ]\n}\n'
    assert json.loads(text) == {"a": 1, "rows": [{"x": [1.0, 2.0]}, {"x": [3.0]}]}


@pytest.mark.slow
def test_committed_results_are_what_the_validation_computes() -> None:
    """The whole validation (four profiles, the sweep, every one-clock pair) re-run gives the committed numbers."""
    committed = json.loads(RAW.read_text())
    fresh = validate.run(committed["points"])
    for key in ("date", "machine"):
        committed.pop(key), fresh.pop(key)
    assert fresh == committed

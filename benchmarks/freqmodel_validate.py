"""Validate the frequency models on real clock-swept data: the Perseus profiles, measured at every clock.

    python benchmarks/freqmodel_validate.py [--update | --out RAW.json]

Two paths, each against what the GPU measured at every clock, error = (predicted - measured) / measured:

- **Profiled clocks** (a clock daemon): the runtime's rule picks ``--points`` clocks
  (`envpipe.profile.clockfit.profile_clocks`, default 4, as `profile_points`); each unit is fitted from those
  (`envpipe.profile.from_measured.profile_from_clocks` with ``predict_mhz``) and predicted at every other
  clock. Also with 2-8 points (the sweep).
- **One clock** (no daemon): each profile's stage-averaged curve (`FrequencyModel.from_profile`) applied to
  the top-clock column of every profile of the *other* GPU kind (`profile_from_measured`), the path every
  H100/H200 plan takes today. Its error range by clock fraction becomes the shipped band
  (envpipe/profile/data/one_clock_band.json, `envpipe.profile.band`).

Writes the raw results (every measured and predicted number) as JSON and renders them
(benchmarks/freqmodel_results.py) beside it; ``--update`` overwrites the committed
benchmarks/results/freqmodel.{json,md} and the shipped band. Deterministic: no timing, no randomness.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.common import ROOT, add_output_options, dated_path, machine_line, output_path
from benchmarks.freqmodel_results import errors, render
from envpipe.profile import FrequencyModel, Profile, load_profile
from envpipe.profile.band import BAND_PATH
from envpipe.profile.clockfit import fit_curve, profile_clocks
from envpipe.profile.from_measured import StageUnits, profile_from_clocks, profile_from_measured

# (name, path from the repository root, GPU): every real clock-swept profile in the repository
PROFILES = (
    ("gpt3-175b+a100_sxm_bf16", "envpipe/profile/data/gpt3-175b+a100_sxm_bf16.csv", "A100 SXM"),
    ("bloom+a100_sxm_bf16", "envpipe/profile/data/bloom+a100_sxm_bf16.csv", "A100 SXM"),
    ("bloom+a40_bf16", "envpipe/profile/data/bloom+a40_bf16.csv", "A40"),
    ("gpt3-175b+a40_bf16", "envpipe/profile/data/gpt3-175b+a40_bf16.csv", "A40"),
)
SWEEP_POINTS = (2, 3, 4, 5, 6, 8)
BAND_FRACTIONS = tuple(round(1.0 - 0.05 * i, 2) for i in range(1, 11))  # 0.95 .. 0.50 of the top clock
KINDS = ("F", "B")


def _g(x: float) -> float:
    """7 significant digits: far below the errors measured, and a JSON that diffs line by line."""
    return float(f"{x:.7g}")


def _list(values: Any) -> list[float]:
    return [_g(float(v)) for v in values]


def _tables(profile: Profile, kind: str) -> tuple[np.ndarray, np.ndarray]:
    return (profile.fwd_time, profile.fwd_energy) if kind == "F" else (profile.bwd_time, profile.bwd_energy)


def fit_from_clocks(profile: Profile, points: int) -> tuple[list[int], Profile, dict[tuple[int, str], float]]:
    """The profiled clocks, the profile predicted from them at every clock, and each unit's fitted cap."""
    profiled = profile_clocks([int(f) for f in profile.freqs], points)
    idx = [profile.freq_index(c) for c in profiled]
    rows = [[StageUnits(float(profile.fwd_time[s, k]), float(profile.bwd_time[s, k]),
                        float(profile.fwd_energy[s, k]), float(profile.bwd_energy[s, k]))
             for s in range(profile.num_stages)] for k in idx]
    predicted = profile_from_clocks(profiled, rows, "validation", predict_mhz=[int(f) for f in profile.freqs])
    caps = {}
    for s in range(profile.num_stages):
        for kind in KINDS:
            t, j = _tables(profile, kind)
            caps[(s, kind)] = fit_curve(profile.freqs[idx], t[s, idx], j[s, idx]).cap_mhz
    return profiled, predicted, caps


def validate_profile(name: str, path: str, gpu: str, profile: Profile, points: int) -> dict[str, Any]:
    """Raw results of the profiled-clocks path on one profile: measured and predicted, per unit and clock."""
    profiled, predicted, caps = fit_from_clocks(profile, points)
    units = []
    for s in range(profile.num_stages):
        for kind in KINDS:
            t, j = _tables(profile, kind)
            pt, pj = _tables(predicted, kind)
            units.append({"stage": s, "kind": kind, "cap_mhz": caps[(s, kind)], "measured_s": _list(t[s]),
                          "measured_j": _list(j[s]), "predicted_s": _list(pt[s]), "predicted_j": _list(pj[s])})
    return {"name": name, "path": path, "gpu": gpu, "digest": profile.digest,
            "clocks_mhz": [int(f) for f in profile.freqs], "profiled_mhz": profiled, "units": units}


def _summary(measured: Profile, predicted: Profile, skip: Sequence[int]) -> dict[str, float]:
    """Median and worst |error| of time and energy over every unit and every clock not in ``skip``."""
    keep = [k for k in range(measured.freqs.size) if k not in set(skip)]
    t = np.concatenate([(predicted.fwd_time - measured.fwd_time) / measured.fwd_time,
                        (predicted.bwd_time - measured.bwd_time) / measured.bwd_time])[:, keep]
    e = np.concatenate([(predicted.fwd_energy - measured.fwd_energy) / measured.fwd_energy,
                        (predicted.bwd_energy - measured.bwd_energy) / measured.bwd_energy])[:, keep]
    return {"time_median": _g(np.median(np.abs(t))), "time_worst": _g(np.max(np.abs(t))),
            "energy_median": _g(np.median(np.abs(e))), "energy_worst": _g(np.max(np.abs(e)))}


def sweep(name: str, profile: Profile, counts: Sequence[int] = SWEEP_POINTS) -> list[dict[str, Any]]:
    rows = []
    for n in counts:
        profiled, predicted, _ = fit_from_clocks(profile, n)
        rows.append({"profile": name, "points": n, "profiled_mhz": profiled,
                     **_summary(profile, predicted, [profile.freq_index(c) for c in profiled])})
    return rows


def one_clock(reference: Profile, target: Profile) -> Profile:
    """The target predicted from its top-clock column and the reference's stage-averaged curve."""
    model = FrequencyModel.from_profile(reference, idle_power_w=1.0)  # idle power plays no part here
    f_t, b_t, f_j, b_j = (t[:, 0].tolist() for t in (target.fwd_time, target.bwd_time, target.fwd_energy,
                                                     target.bwd_energy))
    return profile_from_measured(f_t, b_t, f_j, b_j, [int(f) for f in target.freqs], model)


def one_clock_pairs(profiles: dict[str, tuple[str, Profile]]) -> list[dict[str, Any]]:
    """Every (reference, target) pair of different GPU kinds: the target's units as the one-clock path predicts."""
    out = []
    for ref, (ref_gpu, ref_profile) in profiles.items():
        for target, (gpu, target_profile) in profiles.items():
            if gpu == ref_gpu:
                continue
            predicted = one_clock(ref_profile, target_profile)
            units = [{"stage": s, "kind": kind, "predicted_s": _list(_tables(predicted, kind)[0][s]),
                      "predicted_j": _list(_tables(predicted, kind)[1][s])}
                     for s in range(target_profile.num_stages) for kind in KINDS]
            out.append({"reference": ref, "target": target, "units": units})
    return out


def band_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per fraction of the top clock, the lowest and highest one-clock error over every pair, unit and clock at or
    above it (the top clock itself excluded: there the path returns the measurement)."""
    targets = {p["name"]: p for p in raw["profiles"]}
    rows = []
    for fraction in BAND_FRACTIONS:
        t_err: list[float] = []
        e_err: list[float] = []
        for pair in raw["one_clock"]:
            target = targets[pair["target"]]
            clocks = np.asarray(target["clocks_mhz"], float)
            keep = (clocks >= fraction * clocks[0] - 1e-9) & (clocks < clocks[0])
            for unit, truth in zip(pair["units"], target["units"], strict=True):
                t, e = errors(truth, unit)
                t_err += t[keep].tolist()
                e_err += e[keep].tolist()
        if t_err:
            rows.append({"min_fraction": fraction, "time": [_g(min(t_err)), _g(max(t_err))],
                         "energy": [_g(min(e_err)), _g(max(e_err))]})
    return rows


def run(points: int = 4) -> dict[str, Any]:
    loaded = {name: (path, gpu, load_profile(ROOT / path)) for name, path, gpu in PROFILES}
    raw: dict[str, Any] = {
        "version": 1,
        "generated_by": "benchmarks/freqmodel_validate.py",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "machine": machine_line(),
        "error": "(predicted - measured) / measured",
        "points": points,
        "profiles": [validate_profile(name, path, gpu, p, points) for name, (path, gpu, p) in loaded.items()],
        "sweep": [row for name, (_, _, p) in loaded.items() for row in sweep(name, p)],
        "one_clock": one_clock_pairs({name: (gpu, p) for name, (_, gpu, p) in loaded.items()}),
    }
    raw["band"] = band_rows(raw)
    return raw


def band_file(raw: dict[str, Any]) -> dict[str, Any]:
    """The shipped band (envpipe.profile.band): the rows and where they come from."""
    pairs = [f"{p['reference']} -> {p['target']}" for p in raw["one_clock"]]
    return {"what": "one-clock path (envpipe.profile.from_measured.profile_from_measured): lowest and highest "
                    "relative error of a unit's time and energy at clocks >= min_fraction of the top clock, "
                    "over every reference -> target pair of different GPU kinds (Perseus profiles)",
            "error": raw["error"], "generated_by": raw["generated_by"], "date": raw["date"], "pairs": pairs,
            "rows": raw["band"]}


def dump(data: dict[str, Any]) -> str:
    """JSON with one unit (or row) per line: readable, and small diffs when a number moves."""
    return _json(data, 0) + "\n"


def _json(value: Any, depth: int) -> str:
    def rows(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and any(rows(v) for v in value.values()):
        return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {_json(v, depth + 1)}" for k, v in value.items()) \
            + f"\n{pad}}}"
    if rows(value):
        return "[\n" + ",\n".join(inner + _json(v, depth + 1) for v in value) + f"\n{pad}]"
    return json.dumps(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=4, help="profiled clocks per unit (the runtime's profile_points)")
    add_output_options(parser, "freqmodel.json")
    args = parser.parse_args(argv)
    if args.points < 2:
        parser.error("--points must be at least 2 (one clock is the one-clock path)")
    raw = run(args.points)
    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(raw))
    path.with_suffix(".md").write_text(render(raw))
    if args.update:
        band = BAND_PATH
    else:  # beside the raw file, or a dated name git ignores
        band = path.with_name(f"{path.stem}_band.json") if args.out else dated_path("freqmodel_band.json")
    band.write_text(dump(band_file(raw)))
    print(f"raw results in {path}, rendered in {path.with_suffix('.md')}, the one-clock band in {band}")


if __name__ == "__main__":
    main()

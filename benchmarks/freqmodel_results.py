"""Render the frequency-model validation (benchmarks/freqmodel_validate.py's raw JSON) as Markdown.

    python benchmarks/freqmodel_results.py benchmarks/results/freqmodel.json > benchmarks/results/freqmodel.md

Every number is computed here from the raw file's measured and predicted unit times and energies, with one
error convention: (predicted - measured) / measured.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

TARGET_MEDIAN, TARGET_WORST = 0.03, 0.06

UNVALIDATED = """\
## What remains unvalidated for H100 and H200

Clocks may not be changed on the lent GPUs, so none of the following has been checked against a clock sweep
of an H100 or H200 (what was measured there at default clocks: /work/shared/data/measured/README.md):

- **The fitted form beyond A100 and A40.** Time `a + b/f` and power `static + C f V(f)^2` held on both
  (table above), but Hopper's voltage/frequency curve, its 1980 MHz range (the Perseus tables stop at 855
  MHz, an H100 supports 345 MHz) and its boost behaviour were never swept. The runtime's rule spreads the
  profiled clocks over *every* supported clock (down to 345 MHz on H100/H200), far below the range
  validated here (855 MHz and up); below the lowest profiled clock nothing is predicted.
- **The power cap as a hard knee at one clock per unit.** On H100 a GEMM loop ran at 1395 MHz median but
  1170 MHz at its lowest (700 W cap); the model holds one clock under load per unit (NVML's median during
  calibration) and flat time and power above it. A unit whose kernels mix capped and uncapped phases has a
  soft knee, which the A100 tables show (their worst errors sit just below the top clock).
- **The effective clock per unit kind.** The runtime samples NVML's clock per stage over the whole
  calibration; a forward and a backward of different arithmetic intensity may be capped at different clocks.
- **The one-clock band.** It is the A100 <-> A40 error; an H100 or H200 may depart from the A100 curve by
  more or less. Whether the GPT-3/A100 curve (the default) is closer to Hopper than the A40 one is unknown.
- **Power at the top clock and blocking power.** Measured on H100 (idle 120 W, GEMM 685 W, device copy
  398 W) at default clocks only; how the blocking power moves with a locked clock is not measured.
"""


def errors(truth: dict[str, Any], predicted: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per clock, the relative errors of one unit's time and energy: (predicted - measured) / measured."""
    t, j = np.asarray(truth["measured_s"]), np.asarray(truth["measured_j"])
    return np.asarray(predicted["predicted_s"]) / t - 1.0, np.asarray(predicted["predicted_j"]) / j - 1.0


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f} %" if signed else f"{100 * x:.1f} %"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(*header: str) -> list[str]:
    return [_row(*header), _row(*["---"] * len(header))]


def _signed_worst(x: np.ndarray) -> float:
    return float(x.flat[int(np.argmax(np.abs(x)))])


def _profile_errors(p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, energy) errors as (units, clocks), and the mask of the clocks that were not profiled."""
    pairs = [errors(u, u) for u in p["units"]]
    clocks = np.asarray(p["clocks_mhz"])
    return (np.array([t for t, _ in pairs]), np.array([e for _, e in pairs]),
            ~np.isin(clocks, p["profiled_mhz"]))


def _unit_name(u: dict[str, Any]) -> str:
    return f"stage {u['stage']} {'forward' if u['kind'] == 'F' else 'backward'}"


def _where(p: dict[str, Any], err: np.ndarray, predicted: np.ndarray) -> str:
    """The unit and clock of the largest |error| among the predicted clocks."""
    masked = np.where(predicted[None, :], np.abs(err), -1.0)
    u, k = np.unravel_index(int(np.argmax(masked)), masked.shape)
    return f"{_pct(float(err[u, k]), True)} ({_unit_name(p['units'][u])}, {p['clocks_mhz'][k]} MHz)"


def _largest_drop(p: dict[str, Any]) -> str:
    """The measurement's largest fall in unit time from one clock to the next lower one (a unit that got faster
    at a lower clock), and where: no curve that slows down with the clock can follow it."""
    drops = [(float(np.min(np.diff(u["measured_s"]) / np.asarray(u["measured_s"][:-1]))), i)
             for i, u in enumerate(p["units"])]
    drop, i = min(drops)
    if drop >= 0:
        return "none"
    t = np.asarray(p["units"][i]["measured_s"])
    k = int(np.argmin(np.diff(t) / t[:-1]))
    return f"{_pct(drop, True)} ({_unit_name(p['units'][i])}, {p['clocks_mhz'][k]} → {p['clocks_mhz'][k + 1]} MHz)"


def summary(raw: dict[str, Any]) -> list[str]:
    lines = [f"## {raw['points']} profiled clocks, every other clock predicted", "",
             "Per profile, over every stage, unit kind (forward, backward) and clock that was not profiled. "
             f"Target: {_pct(TARGET_MEDIAN)} median and {_pct(TARGET_WORST)} worst, time and energy. The last "
             "column is the measurement's own largest fall in time one clock lower: a unit that got faster at a "
             "lower clock, which no curve that slows down with the clock can follow.", "",
             *_table("profile", "GPU", "profiled clocks (MHz)", "clocks predicted", "time: median", "time: worst",
                     "energy: median", "energy: worst", "target", "measured: largest time drop one clock lower")]
    for p in raw["profiles"]:
        t, e, keep = _profile_errors(p)
        tk, ek = np.abs(t[:, keep]), np.abs(e[:, keep])
        missed = [name for name, err in (("time", tk), ("energy", ek))
                  if np.median(err) > TARGET_MEDIAN or err.max() > TARGET_WORST]
        lines.append(_row(p["name"], p["gpu"], ", ".join(map(str, p["profiled_mhz"])), int(keep.sum()),
                          _pct(float(np.median(tk))), _where(p, t, keep), _pct(float(np.median(ek))),
                          _where(p, e, keep), "met" if not missed else f"**not met** ({', '.join(missed)})",
                          _largest_drop(p)))
    return lines


def sweep(raw: dict[str, Any]) -> list[str]:
    lines = ["## How many clocks to profile", "",
             "The same, with the runtime's rule picking 2 to 8 clocks (`profile_points`). "
             "Each cell: median / worst |error|.", "",
             *_table("profile", *[f"{n} clocks: time" for n in _points(raw)],
                     *[f"{n} clocks: energy" for n in _points(raw)])]
    by = {(r["profile"], r["points"]): r for r in raw["sweep"]}
    for name in dict.fromkeys(r["profile"] for r in raw["sweep"]):
        cells = [f"{_pct(by[(name, n)]['time_median'])} / {_pct(by[(name, n)]['time_worst'])}" for n in _points(raw)]
        cells += [f"{_pct(by[(name, n)]['energy_median'])} / {_pct(by[(name, n)]['energy_worst'])}"
                  for n in _points(raw)]
        lines.append(_row(name, *cells))
    return lines


def _points(raw: dict[str, Any]) -> list[int]:
    return sorted({r["points"] for r in raw["sweep"]})


def per_stage(raw: dict[str, Any]) -> list[str]:
    lines = ["## Per stage", "",
             "Each unit over the clocks that were not profiled; the cap is the fitted clock above which the unit's "
             "time and power stay flat (the highest profiled clock: none found). In the Perseus tables stages 0-6 "
             "carry the same numbers; the last stage (the output layer and loss) differs.", ""]
    for p in raw["profiles"]:
        t, e, keep = _profile_errors(p)
        lines += [f"### {p['name']} ({p['gpu']})", "",
                  *_table("unit", "fitted cap (MHz)", "time: median", "time: worst", "energy: median",
                          "energy: worst")]
        for i, u in enumerate(p["units"]):
            tk, ek = t[i, keep], e[i, keep]
            lines.append(_row(_unit_name(u), f"{u['cap_mhz']:g}", _pct(float(np.median(np.abs(tk)))),
                              _pct(_signed_worst(tk), True), _pct(float(np.median(np.abs(ek)))),
                              _pct(_signed_worst(ek), True)))
        lines.append("")
    return lines[:-1]


def per_clock(raw: dict[str, Any]) -> list[str]:
    lines = ["## Per clock", "",
             "Each clock over every stage and unit kind (median |error|, and the error of largest magnitude); "
             "at a profiled clock the profile holds the measurement itself.", ""]
    for p in raw["profiles"]:
        t, e, keep = _profile_errors(p)
        lines += [f"### {p['name']} ({p['gpu']})", "",
                  *_table("clock (MHz)", "time: median", "time: worst", "energy: median", "energy: worst")]
        for k, mhz in enumerate(p["clocks_mhz"]):
            if not keep[k]:
                lines.append(_row(mhz, "profiled", "", "", ""))
                continue
            lines.append(_row(mhz, _pct(float(np.median(np.abs(t[:, k])))), _pct(_signed_worst(t[:, k]), True),
                              _pct(float(np.median(np.abs(e[:, k])))), _pct(_signed_worst(e[:, k]), True)))
        lines.append("")
    return lines[:-1]


def one_clock(raw: dict[str, Any]) -> list[str]:
    targets = {p["name"]: p for p in raw["profiles"]}
    lines = ["## One clock (no clock daemon): another GPU's curve", "",
             "Where clocks cannot be changed, the top clock is measured and lower clocks follow a reference curve "
             "(`profile_from_measured`; the runtime's default reference is GPT-3 on A100). Here each profile's "
             "stage-averaged curve is applied to the top-clock column of the profiles of the other GPU kind, at "
             "every clock below the top.", "",
             *_table("reference curve", "target (measured at every clock)", "time: median", "time: range",
                     "energy: median", "energy: range")]
    for pair in raw["one_clock"]:
        target = targets[pair["target"]]
        errs = [errors(truth, unit) for truth, unit in zip(target["units"], pair["units"], strict=True)]
        t = np.concatenate([x[1:] for x, _ in errs])
        e = np.concatenate([x[1:] for _, x in errs])
        lines.append(_row(pair["reference"], pair["target"], _pct(float(np.median(np.abs(t)))),
                          f"{_pct(float(t.min()), True)} … {_pct(float(t.max()), True)}",
                          _pct(float(np.median(np.abs(e)))),
                          f"{_pct(float(e.min()), True)} … {_pct(float(e.max()), True)}"))
    lines += ["", "### The band (`envpipe.profile.band.one_clock_band`)", "",
              "The lowest and highest error over every pair above, every unit and every clock at or above a fraction "
              "of the top clock: shipped as envpipe/profile/data/one_clock_band.json, for the runtime to print next "
              "to a saving planned from one clock. Below 0.50 nothing was measured.", "",
              *_table("clocks at or above (× top)", "time: low … high", "energy: low … high")]
    for row in raw["band"]:
        lines.append(_row(f"{row['min_fraction']:.2f}", _span(row["time"]), _span(row["energy"])))
    return lines


def _span(pair: Iterable[float]) -> str:
    low, high = pair
    return f"{_pct(low, True)} … {_pct(high, True)}"


def render(raw: dict[str, Any]) -> str:
    head = [
        "# Frequency model, validated on clock-swept data",
        "",
        f"Generated by `{raw['generated_by']}` on {raw['date']} ({raw['machine']}); rendered by "
        "`python benchmarks/freqmodel_results.py benchmarks/results/freqmodel.json`. Deterministic: no timing.",
        "",
        "Ground truth: the Perseus (SOSP'24) profiles, each stage's forward and backward time and energy "
        "**measured** at every SM clock on A100 SXM and A40 GPUs (envpipe/profile/data). "
        "Predictions are **simulated** (the models). Error = (predicted − measured) / measured.",
        "",
        "The model (`envpipe.profile.clockfit`): a unit runs at min(f, cap); time a + b/f (clock-bound and "
        "clock-free work); power p0 + p1 f + p3 f³ = static + C f V(f)² with V(f)² = V0² + k f²; fitted per unit "
        "from the profiled clocks, the cap at or above the third-highest profiled clock (or NVML's clock under "
        "load), then anchored to pass through every measurement below the cap.",
    ]
    parts = [head, summary(raw), sweep(raw), one_clock(raw), [UNVALIDATED.rstrip()], per_stage(raw), per_clock(raw),
             ["## Reproduce", "", "```sh", "python benchmarks/freqmodel_validate.py --update", "```"]]
    return "\n\n".join("\n".join(p) for p in parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: freqmodel_results.py RAW.json")
    sys.stdout.write(render(json.loads(Path(args[0]).read_text())))


if __name__ == "__main__":
    main()

"""Render the runtime benchmark's output directory (benchmarks/runtime_h200.sh) as Markdown tables.

    python benchmarks/runtime_results.py OUT [--command "..."] > benchmarks/results/runtime_h200_<date>.md

OUT holds machine.txt and one folder per configuration with bench.json (benchmarks/runtime_bench.py), whose
runs are the runtime's own summaries (read as envpipe.runtime.summary.RunSummary). Every number is
labelled: measured (wall clock, NVML counter) or simulated (the planner, the frequency model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envpipe.runtime.summary import RunSummary


def _f(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(*header: str) -> list[str]:
    return [_row(*header), _row(*["---"] * len(header))]


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _energy(s: RunSummary) -> float | None:
    return s.steady.energy_j.median if s.steady.energy_j is not None else None


def throughput(name: str, bench: dict[str, Any]) -> list[str]:
    rows = []
    for run in bench["runs"]:
        stock = [RunSummary.from_json(r["stock"]) for r in run["rounds"]]
        rt = [RunSummary.from_json(r["runtime_1f1b"]) for r in run["rounds"]]
        ratio = run["throughput_ratio"]
        per_round = ", ".join(_f(x, 3) for x in ratio["per_round"])
        peak = [max((g.peak_memory_bytes or 0) for g in s.gpus) / 2**30 for s in (stock[-1], rt[-1])]
        rows.append(_row(
            name, bench["stages"], run["M"], _f(_median([s.steady.time_s.median for s in stock])),
            _f(_median([s.steady.time_s.median for s in rt])),
            f"**{_f(ratio['median'], 3)}** ({_f(ratio['min'], 3)}–{_f(ratio['max'], 3)}; {per_round})",
            f"{_f(_median([_energy(s) for s in stock]), 1)} → {_f(_median([_energy(s) for s in rt]), 1)}",
            f"{_f(peak[0], 1)} / {_f(peak[1], 1)}"))
    return rows


def predictions(name: str, bench: dict[str, Any]) -> list[str]:
    rows = []
    for run in bench["runs"]:
        rt = [RunSummary.from_json(r["runtime_1f1b"]) for r in run["rounds"]]
        cases = [("1F1B, every clock at max (median over rounds)", rt)]
        if run.get("runtime_envpipe"):
            cases.append(("EnvPipe's order, every clock at max", [RunSummary.from_json(run["runtime_envpipe"])]))
        if run.get("runtime_optimal"):
            s = RunSummary.from_json(run["runtime_optimal"])
            ran = "its plan" if s.plan is not None and s.plan.deployed else "1F1B at default clocks (plan not deployed)"
            cases.append((f"policy optimal; the steady phase ran {ran}", [s]))
        for what, runs in cases:
            rows.append(_row(name, run["M"], what, _f(_median([s.predicted_iteration_time_s for s in runs])),
                             _f(_median([s.steady.time_s.median for s in runs])),
                             f"**{_pct(_median([s.prediction_error for s in runs]))}**"))
    return rows


def plans(name: str, bench: dict[str, Any]) -> list[str]:
    lines = []
    for run in bench["runs"]:
        if not run.get("runtime_optimal"):
            continue
        s = RunSummary.from_json(run["runtime_optimal"])
        plan, p, cal = s.plan, s.predicted, s.calibration
        assert plan is not None
        lines += [f"### {name}, {s.stages} stages, M = {run['M']}", "",
                  f"- policy {plan.policy}, order {plan.order}; {'deployed' if plan.deployed else 'not deployed'}"
                  f" ({s.clock.note or s.clock.kind}); from {plan.source}; budget {_f(plan.budget_s)} s (simulated)"]
        if p is not None:
            lines.append(f"- the planner's prediction, **simulated** against its own 1F1B all-max baseline "
                         f"({p.profile}): energy saving **{100 * p.energy_saving:.1f}%**, slowdown "
                         f"{_pct(p.slowdown)}; {p.energy_j:.1f} J vs {p.baseline_energy_j:.1f} J per iteration")
        if s.measured is not None and s.measured.energy_saving is not None:
            lines.append(f"- measured against this run's interleaved 1F1B all-max iterations: energy saving "
                         f"{_pct(s.measured.energy_saving.median)}, slowdown {_pct(s.measured.slowdown.median)}")
        if cal is not None:
            eff = ", ".join("—" if c is None else f"{c:.0f}" for c in cal.effective_clock_mhz)
            lines.append(f"- measured in calibration: SM clock under load per stage {eff} MHz (NVML); blocking "
                         f"power {_f(cal.idle_power_w, 1)} W (idle GPU, NVML counter over 0.5 s)")
        for st, cs in enumerate(plan.clocks or []):
            lines.append(f"- stage {st} clocks (MHz, execution order): {' '.join(str(c) for c in cs)}")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--command", default="bash benchmarks/runtime_h200.sh")
    args = p.parse_args(argv)
    out = Path(args.out)
    benches = {d.name: json.loads((d / "bench.json").read_text()) for d in sorted(out.glob("*/"))
               if (d / "bench.json").is_file()}
    if not benches:
        print(f"{out}: no */bench.json (run benchmarks/runtime_h200.sh first)", file=sys.stderr)
        return 2
    try:
        return _render(out, benches, args.command)
    except ValueError as e:  # a bench.json written by an older runtime (summary schema changed)
        print(f"{out}: {e}", file=sys.stderr)
        return 2


def _render(out: Path, benches: dict[str, Any], command: str) -> int:
    first = next(iter(benches.values()))
    machine = (out / "machine.txt").read_text().strip() if (out / "machine.txt").is_file() else "?"
    lines = [f"# EnvPipe runtime vs stock DeepSpeed ({first['device']}, {first['started_utc']} UTC)", "",
             f"Command: `{command}`. Clocks never changed (no clock daemon: the runtime ran at default "
             "clocks and read the NVML energy counter). Every number is measured unless it says simulated.", "",
             "```", machine, "```", "", "## Throughput: the runtime in 1F1B order, every clock at max, vs stock", "",
             f"Interleaved rounds, stock first in even rounds and last in odd ones; {first['steps']} steady iterations "
             "per run; ratio = stock median iteration / runtime median iteration, per round.", "",
             *_table("model", "stages", "M", "stock iteration (s)", "runtime iteration (s)",
                     "throughput ratio runtime/stock: median (min–max; per round)",
                     "energy / iteration, all GPUs, stock → runtime (J, measured)",
                     "peak memory stock / runtime (GiB)")]
    for name, bench in benches.items():
        lines += throughput(name, bench)
    lines += ["", "## Predicted vs measured iteration time", "",
              "Predicted: the runtime's simulator with the calibrated unit, transfer and tail times (simulated); "
              "measured: the median steady iteration.", "",
              *_table("model", "M", "what ran", "predicted (s)", "measured (s)", "error")]
    for name, bench in benches.items():
        lines += predictions(name, bench)
    lines += ["", "## The plan of the runtime's default policy (optimal)", ""]
    for name, bench in benches.items():
        lines += plans(name, bench)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Render the runtime benchmark's output directory (benchmarks/runtime_h200.sh) as Markdown tables.

    python benchmarks/runtime_results.py OUT [--command "..."] > benchmarks/results/runtime_h200_<date>.md

OUT holds machine.txt, optionally command.txt (the command that produced it), and one folder per model with
bench.json (benchmarks/runtime_bench.py), whose runs are the runtime's own summaries (read as
envpipe.runtime.summary.RunSummary). Every number is labelled: measured (wall clock, NVML counter) or
simulated (the planner, the frequency model). Prediction errors are (predicted - measured) / measured,
computed here from each run's predicted and measured iteration times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.common import command_of, md_row, md_table, prediction_error, shown_path
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime.summary import RunSummary

DEFAULT_COMMAND = "bash benchmarks/runtime_h200.sh"


def _f(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _energy(s: RunSummary) -> float | None:
    return s.steady.energy_j.median if s.steady.energy_j is not None else None


def _error(s: RunSummary) -> float | None:
    if s.predicted_iteration_time_s is None:
        return None
    return prediction_error(s.predicted_iteration_time_s, s.steady.time_s.median)


def _errors(runs: list[RunSummary]) -> str:
    """The median error over runs, bold, and its range where there are several."""
    errors = [e for e in (_error(s) for s in runs) if e is not None]
    if not errors:
        return "—"
    median = f"**{_pct(statistics.median(errors))}**"
    return median if len(errors) == 1 else f"{median} ({_pct(min(errors))} to {_pct(max(errors))})"


def order_that_ran(s: RunSummary) -> str:
    """Which order the steady phase ran, read from its last iteration's measured units (not from the plan)."""
    if not s.units_last_iteration or s.plan is None:
        return "not recorded"
    ran = [[f"{u.kind}{u.mb}" for u in stage] for stage in s.units_last_iteration]
    one_f = [[f"{kind}{mb}" for kind, mb in stage] for stage in one_f_one_b(s.stages, s.microbatches)]
    if ran == s.plan.orders:
        order = "the plan's order" if ran != one_f else "1F1B"
    elif ran == one_f and s.plan.deployed and s.baseline is not None:
        # a deployed plan's steady phase interleaves 1F1B all-max comparisons: the last may be one of them
        order = "not seen (the last iteration was a 1F1B all-max comparison)"
    else:
        order = "1F1B" if ran == one_f else "neither the plan's order nor 1F1B"
    clocks = "its planned clocks" if s.plan.deployed else "default clocks (plan not deployed)"
    return f"{order}, {clocks}"


def throughput(name: str, bench: dict[str, Any]) -> list[str]:
    rows = []
    for run in bench["runs"]:
        stock = [RunSummary.from_json(r["stock"]) for r in run["rounds"]]
        rt = [RunSummary.from_json(r["runtime_1f1b"]) for r in run["rounds"]]
        ratio = run["throughput_ratio"]
        per_round = ", ".join(_f(x, 3) for x in ratio["per_round"])
        rows.append(md_row(
            name, bench["stages"], run["M"], _f(_median([s.steady.time_s.median for s in stock])),
            _f(_median([s.steady.time_s.median for s in rt])),
            f"**{_f(ratio['median'], 3)}** ({_f(ratio['min'], 3)}–{_f(ratio['max'], 3)}; {per_round})",
            f"{_f(_median([_energy(s) for s in stock]), 1)} → {_f(_median([_energy(s) for s in rt]), 1)}"))
    return rows


def predictions(name: str, bench: dict[str, Any]) -> list[str]:
    rows = []
    for run in bench["runs"]:
        rounds = [RunSummary.from_json(r["runtime_1f1b"]) for r in run["rounds"]]
        cases = [("baseline, 1F1B (median over rounds)", rounds)]
        for key in ("runtime_envpipe", "runtime_optimal"):
            if run.get(key):
                s = RunSummary.from_json(run[key])
                assert s.plan is not None
                cases.append((f"{s.plan.policy}, {s.plan.order}", [s]))
        for planned, runs in cases:
            ran = sorted({order_that_ran(s) for s in runs})
            rows.append(md_row(name, run["M"], planned, "; ".join(ran),
                               _f(_median([s.predicted_iteration_time_s for s in runs])),
                               _f(_median([s.steady.time_s.median for s in runs])), _errors(runs)))
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


def load(out: Path) -> dict[str, Any]:
    """The bench.json of every model folder of OUT, by folder name."""
    benches = {d.name: json.loads((d / "bench.json").read_text()) for d in sorted(out.glob("*/"))
               if (d / "bench.json").is_file()}
    if not benches:
        raise ValueError("no */bench.json (run benchmarks/runtime_h200.sh first)")
    return benches


def render(out: Path, command: str | None = None) -> str:
    """The results file of OUT (ValueError: no bench.json, or one the RunSummary type cannot read)."""
    benches = load(out)
    command = command or command_of(out, DEFAULT_COMMAND)
    first = next(iter(benches.values()))
    machine = (out / "machine.txt").read_text().strip() if (out / "machine.txt").is_file() else "?"
    lines = [f"# EnvPipe runtime vs stock DeepSpeed ({first['device']}, {first['started_utc']} UTC)", "",
             f"Command: `{command}`. Clocks never changed (no clock daemon: the runtime ran at default "
             "clocks and read the NVML energy counter). Every number is measured unless it says simulated.", "",
             "```", machine, "```", "", "## Throughput: the runtime in 1F1B order, every clock at max, vs stock", "",
             f"Interleaved rounds, stock first in even rounds and last in odd ones; {first['steps']} steady iterations "
             "per run; ratio = stock median iteration / runtime median iteration, per round. Peak memory is not "
             "shown: both engines were built in one process per stage, so the allocator's peak held both.", "",
             *md_table("model", "stages", "M", "stock iteration (s)", "runtime iteration (s)",
                       "throughput ratio runtime/stock: median (min–max; per round)",
                       "energy / iteration, all GPUs, stock → runtime (J, measured)")]
    for name, bench in benches.items():
        lines += throughput(name, bench)
    lines += ["", "## Predicted vs measured iteration time", "",
              "Predicted: the runtime's simulator with the calibrated unit, transfer and tail times (simulated); "
              "measured: the median steady iteration; error = (predicted − measured) / measured per run, the "
              "median and the range over rounds. *Order that ran*: read from the last iteration's measured units.",
              "", *md_table("model", "M", "policy, planned order", "order that ran", "predicted (s)", "measured (s)",
                            "error")]
    for name, bench in benches.items():
        lines += predictions(name, bench)
    lines += ["", "## The plan of the runtime's default policy (optimal)", ""]
    for name, bench in benches.items():
        lines += plans(name, bench)
    raw = shown_path(out)
    lines.append(f"Raw data: `{raw}/` (machine.txt, */bench.json); rendered by "
                 f"`python benchmarks/runtime_results.py {raw}`.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--command", default=None, help=f"the command that produced OUT (default: OUT/command.txt, "
                                                     f"else {DEFAULT_COMMAND!r})")
    args = p.parse_args(argv)
    try:
        print(render(Path(args.out), args.command), end="")
    except ValueError as e:  # no bench.json, or one written by an older runtime (summary schema changed)
        print(f"{args.out}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

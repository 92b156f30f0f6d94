"""Render the runtime-vs-stock benchmark's raw folders as Markdown tables, whichever runtime wrote them.

    python benchmarks/runtime_results.py rounds OUT [--command "..."] > benchmarks/results/runtime_h200_<date>.md
    python benchmarks/runtime_results.py rounds RAW... > benchmarks/results/runtime_h200.md

OUT (benchmarks/runtime_h200.sh, 2026-11-23 on) holds machine.txt, optionally command.txt (the command that
produced it), and one folder per model with bench.json (benchmarks/runtime_bench.py), whose runs are the
runtime's own summaries (read as envpipe.runtime.summary.RunSummary). RAW (2026-11-22, the runtime before its
typed run summary, read by their keys) holds machine.txt, command.txt and either */summary.json (one run per
process: stock, the runtime in 1F1B order, in EnvPipe's order, 1F1B again) or bench.json (interleaved rounds of
stock, the EnvPipe engine alone and the runtime in 1F1B order, then the runtime in EnvPipe's order). Every number
is labelled: measured (wall clock, NVML counter) or simulated (the planner, the frequency model). Prediction
errors are (predicted - measured) / measured, from each run's predicted and measured iteration times.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import command_of, md_row, md_table, prediction_error, shown_path
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime.summary import RunSummary

DEFAULT_COMMAND = "bash benchmarks/runtime_h200.sh"
GIB = 2**30
RUN_ORDER = ("stock", "envpipe_1f1b", "envpipe_order", "envpipe_1f1b_again")  # 2026-11-22's script's order


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
                 f"`python benchmarks/runtime_results.py rounds {raw}`.")
    return "\n".join(lines) + "\n"



# The runtime of 2026-11-22 (before its typed run summary): its raw folders, read by their keys.


def _each(xs: list[float], digits: int, scale: float = 1.0) -> str:
    return " / ".join(_f(x / scale, digits) for x in xs)


def _dict_error(run: dict[str, Any]) -> float | None:
    predicted = run.get("predicted_iteration_time_s")
    return None if predicted is None else prediction_error(predicted, run["iteration_time_s"])


def _spread(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.3f} ({ratio['min']:.3f}–{ratio['max']:.3f})"


def _source(raw: Path) -> list[str]:
    machine = (raw / "machine.txt").read_text().strip()
    return [f"`{shown_path(raw)}/`: {command_of(raw, '?')}", "", "```", machine, "```", ""]


def separate_runs(raw: Path) -> list[str]:
    """The morning's runs, one process each: a row per run."""
    runs = {d.name: json.loads((d / "summary.json").read_text()) for d in sorted(raw.glob("*/"))
            if (d / "summary.json").is_file()}
    stock = runs["stock"]
    shape = next(r for r in runs.values() if "microbatches" in r)  # stock's summary did not record its shape
    rows = []
    for name in [n for n in RUN_ORDER if n in runs] + sorted(set(runs) - set(RUN_ORDER)):
        r = runs[name]
        rows.append(md_row(
            shape["stages"], shape["microbatches"], name,
            _f(r["iteration_time_s"]), _f(stock["iteration_time_s"] / r["iteration_time_s"], 3),
            _f(r["energy_per_iteration_j"], 1), _each(r["energy_per_gpu_j"], 1),
            _each(r["peak_memory_bytes_per_stage"], 1, GIB), _f(r.get("predicted_iteration_time_s")),
            _pct(_dict_error(r))))
    return rows


def rounds_summary(raw: Path, bench: dict[str, Any]) -> list[str]:
    rows = []
    for run in bench["runs"]:
        stock = [r["stock"] for r in run["rounds"]]
        rt = [r["runtime_1f1b"] for r in run["rounds"]]
        envpipe = run.get("runtime_envpipe")
        rows.append(md_row(
            bench["started_utc"], f"{bench['rounds']} × {bench['steps']}", run["M"],
            _f(_median([s["iteration_time_s"] for s in stock])), _f(_median([s["iteration_time_s"] for s in rt])),
            f"**{_spread(run['throughput_ratio'])}**", _spread(run["engine_ratio"]) if run.get("engine_ratio") else "—",
            _pct(_dict_error(rt[-1])), _pct(_dict_error(envpipe)) if envpipe else "—",
            f"{_f(_median([s['energy_per_iteration_j'] for s in stock]), 1)} → "
            f"{_f(_median([s['energy_per_iteration_j'] for s in rt]), 1)}"))
    return rows


def unit_rows(bench: dict[str, Any]) -> list[str]:
    rows = []
    for run in bench["runs"]:
        s = run["rounds"][-1]["runtime_1f1b"]
        cal, energy, ends = s["calibration"], s.get("unit_energy_per_stage") or [], run.get("stage_ends") or {}
        for st in range(bench["stages"]):
            e = energy[st] if st < len(energy) and energy[st] else {}
            rows.append(md_row(
                bench["started_utc"], run["M"], st, _f(1e3 * cal["fwd_s"][st], 2), _f(1e3 * cal["bwd_s"][st], 2),
                _f(1e3 * cal["gap_s"][st], 2), f"{_f(e.get('F_j'), 2)} / {_f(e.get('B_j'), 2)}",
                _f(1e3 * ends["measured_s"][st], 1) if ends else "—",
                _f(1e3 * ends["predicted_s"][st], 1) if ends else "—"))
    return rows


def plan_rows(bench: dict[str, Any]) -> list[str]:
    rows = []
    for run in bench["runs"]:
        p = run.get("deployable_plan")
        if p:
            seen = "idle GPU" if "idle_power_w" in bench else "between units, from the counter"
            rows.append(md_row(bench["started_utc"], run["M"], f"{p['idle_power_w']:.0f} ({seen})", p["reschedule"],
                               p["valley_mhz"], f"{100 * p['saving']:.1f}%", _pct(p["slowdown"])))
    return rows


def render_nov22(raws: list[Path]) -> str:
    """The results file of the 2026-11-22 raw folders (one process per run, or interleaved rounds)."""
    separate = [r for r in raws if not (r / "bench.json").is_file()]
    rounds = [(r, json.loads((r / "bench.json").read_text())) for r in raws if (r / "bench.json").is_file()]
    lines = ["# The runtime of 2026-11-22 on H200: stock DeepSpeed 1F1B vs the EnvPipe runtime (measured)", "",
             "Runs of an earlier runtime (before its typed run summary), kept as measured then; the current "
             "runtime's results are in [runtime_h200_2026-11-23.md](runtime_h200_2026-11-23.md). Clocks were never "
             "changed (no clock daemon: the runtime recorded clock requests only); energy is the NVML cumulative "
             "energy counter; every prediction is simulated. Error = (predicted − measured) / measured.", ""]
    if separate:
        lines += ["## One process per run", "",
                  "Each run its own process, in this order: stock DeepSpeed, the runtime in 1F1B order, in EnvPipe's "
                  "order (default clocks), in 1F1B order again (run-to-run noise). The prediction had no calibrated "
                  "transfer or tail.", "",
                  *md_table("stages", "M", "run", "iteration (s)", "throughput vs stock", "energy / iteration (J)",
                            "per GPU (J)", "peak memory per stage (GiB)", "predicted (s)", "error")]
        for raw in separate:
            lines += separate_runs(raw)
        lines.append("")
        for raw in separate:
            lines += _source(raw)
    if rounds:
        lines += ["## Interleaved rounds, 2 stages", "",
                  "Each round, in one process per stage: stock DeepSpeed 1F1B, the EnvPipe engine alone (no timing, "
                  "no meter) and the runtime in 1F1B order, every clock at max; then the runtime in EnvPipe's order "
                  "once. Throughput ratios: stock median iteration / the other's, per round (median, min–max). The "
                  "prediction uses the calibrated transfer and tail. Peak memory is not shown: the engines shared "
                  "each process, so the allocator's peak held all of them.", "",
                  *md_table("run started (UTC)", "rounds × iterations", "M", "stock iteration (s)",
                            "runtime 1F1B iteration (s)", "throughput ratio runtime/stock",
                            "engine alone/stock", "error, runtime 1F1B (last round)", "error, EnvPipe's order",
                            "energy / iteration, stock → runtime (J)")]
        for raw, bench in rounds:
            lines += rounds_summary(raw, bench)
        lines += ["", "### Unit times per stage (default clock) and the simulator's stage ends", "",
                  "From the last round's runtime run: calibrated unit times, the mean unit energy (NVML counter "
                  "interpolated at unit boundaries), and when each stage's last unit ended, measured and predicted.",
                  "", *md_table("run started (UTC)", "M", "stage", "F (ms)", "B (ms)", "overhead before a unit (ms)",
                                "F / B energy (J)", "last unit ends: measured (ms)", "predicted (ms)")]
        for _, bench in rounds:
            lines += unit_rows(bench)
        lines += ["", "### The plan the planner would have deployed (simulated)", "",
                  "EnvPipe's envelope with balanced reconfiguration on the measured units, lower clocks from the "
                  "frequency model (the A100 curve scaled to this GPU's clock range), charging waits at the blocking "
                  "power shown (measured).", "",
                  *md_table("run started (UTC)", "M", "blocking power (W)", "r_s", "valley clocks (MHz)",
                            "saving", "slowdown")]
        for _, bench in rounds:
            lines += plan_rows(bench)
        lines.append("")
        for raw, _ in rounds:
            lines += _source(raw)
    shown = " ".join(shown_path(r) for r in raws)
    lines.append(f"Rendered by `python benchmarks/runtime_results.py rounds {shown}`.")
    return "\n".join(lines) + "\n"


def is_typed(out: Path) -> bool:
    """An output folder of 2026-11-23 on: a folder per model with bench.json."""
    return any(out.glob("*/bench.json"))


def is_nov22(raw: Path) -> bool:
    """A raw folder of 2026-11-22: bench.json of interleaved rounds, or a summary.json per run."""
    return (raw / "bench.json").is_file() or any(raw.glob("*/summary.json"))

"""Render the runtime's GPU runs of 2026-11-22 (the runtime before its typed run summary) from their raw files.

    python benchmarks/runtime_nov22_results.py RAW... > benchmarks/results/runtime_h200.md

Each RAW directory holds machine.txt, command.txt (what ran, and the script's commit) and either
- */summary.json: one run per process (the morning's script: stock, the runtime in 1F1B order, in EnvPipe's
  order, 1F1B again), or
- bench.json: interleaved rounds of stock, the EnvPipe engine alone and the runtime in 1F1B order in one
  process per stage, then the runtime in EnvPipe's order (the evening's benchmarks/runtime_bench.py).
Those files predate envpipe.runtime.summary.RunSummary, so they are read by their keys here. Prediction
errors are (predicted - measured) / measured, from each run's predicted and measured iteration times.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median as _median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.common import command_of, md_row, md_table, prediction_error, shown_path

GIB = 2**30
RUN_ORDER = ("stock", "envpipe_1f1b", "envpipe_order", "envpipe_1f1b_again")  # the morning script's order


def _f(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _each(xs: list[float], digits: int, scale: float = 1.0) -> str:
    return " / ".join(_f(x / scale, digits) for x in xs)


def _error(run: dict[str, Any]) -> float | None:
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
            _pct(_error(r))))
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
            _pct(_error(rt[-1])), _pct(_error(envpipe)) if envpipe else "—",
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


def render(raws: list[Path]) -> str:
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
    lines.append(f"Rendered by `python benchmarks/runtime_nov22_results.py {shown}`.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    raws = [Path(a) for a in argv]
    missing = [str(r) for r in raws if not (r / "machine.txt").is_file()]
    if missing:
        print(f"not a raw run directory (no machine.txt): {', '.join(missing)}", file=sys.stderr)
        return 2
    print(render(raws), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

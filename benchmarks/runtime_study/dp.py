"""Table of a data x pipeline benchmark: one row per run from each run's summary.json (benchmarks/dp_h200.sh).

Usage: python benchmarks/runtime_results.py dp-table OUT_DIR RUN...  (RUN: a report directory name under OUT_DIR)
       python benchmarks/runtime_results.py dp OUT_DIR...  (a results file: every folder's command, machine, table)
Prints Markdown: shape, iteration time and throughput (measured), job-wide energy per iteration summed
over every GPU of every node and per node (label from the report), and per stage the gradient
all-reduce and the tail (step end - last unit end) measured on each replica vs the calibrated tail the
runtime's prediction used (simulated). A run the script skipped (too few GPUs: OUT_DIR/RUN.skipped) or
that failed (OUT_DIR/RUN.failed) gets a row that says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import shown_path
from envpipe.runtime.summary import RunSummary


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, list):
        return " / ".join(_fmt(v, digits) for v in x)
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def row(name: str, s: RunSummary, stock: RunSummary | None) -> str:
    job = s.job
    shape = f"DP{job.data_parallel}×PP{s.stages}"
    thr = s.steady.throughput_samples_per_s
    ratio = thr / stock.steady.throughput_samples_per_s if stock else None
    energy = s.steady.energy_j.median if s.steady.energy_j is not None else None
    reduce = "; ".join(
        f"s{t.stage}: all-reduce {_fmt(t.measured_allreduce_s, 2)}, tail {_fmt(t.measured_tail_s, 2)} "
        f"(simulated tail {_fmt(t.simulated_tail_s, 2)})"
        for t in job.tails
        if any(v is not None for v in t.measured_allreduce_s)
    )
    cells = [name, shape, _fmt(s.steady.time_s.median), _fmt(thr), _fmt(ratio, 3), f"{_fmt(energy)} ({s.clock.energy})",
             _fmt([n.energy_per_iteration_j for n in job.nodes]), _fmt(s.predicted_iteration_time_s), reduce or "—"]
    return "| " + " | ".join(cells) + " |"


def _missing(out: Path, name: str) -> str:
    """Why a run has no summary: the script's note (skipped, failed), else "not run or failed"."""
    for kind in ("skipped", "failed"):
        note = out / f"{name}.{kind}"
        if note.exists():
            return note.read_text().strip() or kind
    return "not run or failed"


def table(out: Path, runs: list[str]) -> str:
    """The table of ``runs`` under ``out`` (envpipe_X compared with stock_X)."""
    lines = ["| run | shape | iteration (s, measured) | samples/s | vs stock | energy / iteration, all GPUs (J) "
             "| per node (J) | predicted (s, simulated) | per stage, per replica (s, measured) |",
             "|---|---|---|---|---|---|---|---|---|"]
    summaries = {n: RunSummary.load(out / n / "summary.json") for n in runs if (out / n / "summary.json").exists()}
    for name in runs:
        if name not in summaries:
            lines.append(f"| {name} | {_missing(out, name)} | | | | | | | |")
            continue
        lines.append(row(name, summaries[name], summaries.get(name.replace("envpipe", "stock", 1))))
    return "\n".join(lines) + "\n"


RUNS = ["stock_dp1", "envpipe_dp1", "stock_dp2", "envpipe_dp2", "stock_dp2_zero1", "envpipe_dp2_zero1"]  # dp_h200.sh's


def render(outs: list[Path]) -> str:
    """A results file of dp_h200.sh's output folders: each one's command, machine and table."""
    parts = ["# Data x pipeline parallelism: stock DeepSpeed against the drop-in engine", "",
             "One run per engine and shape (benchmarks/dp_h200.sh: not interleaved, so single-run noise applies). "
             "Clocks never changed (clock 'readonly'). Times and energies measured; predictions simulated.", ""]
    for out in outs:
        command = (out / "command.txt").read_text().strip() if (out / "command.txt").is_file() else "not recorded"
        machine = (out / "machine.txt").read_text().strip().splitlines()
        parts += [f"Raw data: `{shown_path(out)}`. Command: `{command}`. Machine:", "",
                  *(f"    {x}" for x in machine), "", table(out, [r for r in RUNS if (out / f"{r}.log").exists()]),
                  f"Rendered by `python benchmarks/runtime_results.py dp {shown_path(out)}`.", ""]
    return "\n".join(parts)

"""The ablation of the drop-in engine (benchmarks/dropin_ablation.py's OUT/ablation.json): per variant its median
iteration and its cost over DeepSpeed's own path, per cycle in the same job."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.common import md_row, md_table, shown_path
from benchmarks.dropin_ablation import VARIANTS


def render(outs: list[Path]) -> str:
    """The table: per variant, its median iteration and its cost over DeepSpeed's own path (median of the per-cycle
    ratios, and their interquartile range)."""
    lines = ["# Where the drop-in engine's time goes: an ablation in one job", "",
             "Each part of the drop-in engine switched on alone on top of DeepSpeed's own steps, every variant once "
             "per cycle in a shuffled order (benchmarks/dropin_ablation.py). Cost: per cycle, the variant's iteration "
             "over DeepSpeed's own path's in the same cycle, less 1; median and interquartile range over the cycles. "
             "Measured (wall clock, the slowest rank's iteration); clocks never changed.", ""]
    for out in outs:
        data = json.loads((out / "ablation.json").read_text())
        machine = (out / "machine.txt").read_text().strip().splitlines() if (out / "machine.txt").is_file() else []
        by = {v: {r["cycle"]: r["time_s"] for r in data["iterations"] if r["variant"] == v} for v in VARIANTS}
        caveat = [] if data.get("meter_timed") == "polling only" else [
            "This run's `meter` iterations also timed starting and stopping the meter (NVML's init and shutdown, the "
            "thread's start and join: the script of that day created it inside the timer): an upper bound on the "
            "polling's cost, not the cost itself.", ""]
        lines += [f"## {data['model']}, {data['stages']} stages, M = {data['microbatches']}, {data['cycles']} cycles",
                  "", f"Raw data: `{shown_path(out)}`. Command: `{data['command']}`. Machine:", "",
                  *(f"    {x}" for x in machine), "", *caveat,
                  *md_table("variant", "iteration (ms, median)", "cost over DeepSpeed's path (median)", "IQR")]
        base = by["deepspeed"]
        for v in VARIANTS:
            costs = sorted(by[v][c] / base[c] - 1.0 for c in by[v] if c in base)
            q1, _, q3 = statistics.quantiles(costs, n=4, method="inclusive") if len(costs) > 1 else (costs[0],) * 3
            lines.append(md_row(v, f"{1e3 * statistics.median(by[v].values()):.1f}",
                                f"{100 * statistics.median(costs):+.2f}%", f"{100 * q1:+.2f}% to {100 * q3:+.2f}%"))
        lines.append("")
    return "\n".join(lines) + f"Rendered by `python benchmarks/runtime_results.py ablation " \
        f"{' '.join(shown_path(o) for o in outs)}`.\n"

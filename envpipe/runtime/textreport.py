"""The run's summary as a few lines of text (what `make demo` prints); every number says its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1e3 * x:.1f} ms"


def render(summary: dict[str, Any], report_dir: str | Path) -> str:
    energy = summary.get("energy", "none")
    out = Path(report_dir)
    lines = [
        f"EnvPipe runtime: {summary.get('stages')} stages x {summary.get('microbatches')} micro-batches, "
        f"type {summary.get('type')}, scheduling {summary.get('scheduling')}, reconfig {summary.get('reconfig')}",
        f"  iteration time (measured, median of {summary['iterations']}): {_ms(summary['iteration_time_s'])}; "
        f"throughput {summary['throughput_samples_per_s']:.2f} samples/s",
        f"  predicted iteration time (simulator, calibrated transfer/tail): "
        f"{_ms(summary.get('predicted_iteration_time_s'))}"
        + (f" (measured {100 * err:+.1f}%)" if (err := summary.get("predicted_error")) is not None else ""),
    ]
    if summary.get("energy_per_iteration_j") is not None:
        per_gpu = " / ".join(f"{e:.1f}" for e in summary["energy_per_gpu_j"])
        total = summary["energy_per_iteration_j"]
        lines.append(f"  energy per iteration ({energy}): {total:.1f} J (per GPU {per_gpu})")
    for s, u in enumerate(summary.get("unit_energy_per_stage") or []):
        if u and u.get("F_j") is not None:
            lines.append(
                f"  stage {s} unit energy ({u['energy']}, counter at unit boundaries): "
                f"F {u['F_j']:.2f} J, B {u['B_j']:.2f} J, idle {u['idle_w'] or 0:.0f} W"
            )
    if "energy_saving_vs_baseline" in summary:
        lines.append(
            f"  this run vs the 1F1B all-max baseline ({summary.get('baseline_source')}): energy saving "
            f"{100 * summary['energy_saving_vs_baseline']:.1f}%, slowdown {100 * summary['slowdown_vs_baseline']:+.1f}%"
        )
    if summary.get("predicted_saving_vs_baseline") is not None:
        base_t = summary["baseline"]["time_s"]
        lines.append(
            f"  the planner's prediction for this plan (simulated): energy saving "
            f"{100 * summary['predicted_saving_vs_baseline']:.1f}%, "
            f"slowdown {100 * (summary['predicted_iteration_time_s'] / base_t - 1):+.1f}%"
        )
    rec = summary.get("reconfiguration")
    if rec:
        times = ", ".join(_ms(t) for t in rec["measured_time_s_per_round"])
        lines.append(
            f"  reconfiguration ({rec['method']}, measured waits): {rec['rounds']} rounds, {rec['raises']} raises, "
            f"stopped: {rec['stop_reason']}; iteration per round {times}"
        )
    clocks = summary.get("clocks")
    if clocks:
        for s, cs in enumerate(clocks):
            lines.append(f"  stage {s} clocks (MHz, execution order): {' '.join(str(c) for c in cs)}")
    peak = summary.get("peak_memory_bytes_per_stage") or []
    lines.append("  peak memory per stage: " + " / ".join(f"{(p or 0) / 2**20:.0f} MiB" for p in peak))
    lines.append(f"  report: {out / 'summary.json'}, per-iteration lines {out}/iterations.rank*.jsonl, "
                 f"Gantt of measured units {out / 'gantt.png'}")
    return "\n".join(lines)

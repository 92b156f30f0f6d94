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
    for i, u in enumerate(summary.get("unit_energy_per_stage") or []):
        if u and u.get("F_j") is not None:
            lines.append(
                f"  {_where(i, summary)} unit energy ({u['energy']}, counter at unit boundaries): "
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
    lines += _job_lines(summary.get("job"), energy)
    clocks = summary.get("clocks")
    if clocks:
        for s, cs in enumerate(clocks):
            lines.append(f"  stage {s} clocks (MHz, execution order): {' '.join(str(c) for c in cs)}")
    peak = summary.get("peak_memory_bytes_per_stage") or []
    per = "stage" if (summary.get("job") or {}).get("data_parallel", 1) < 2 else "GPU (replica-major)"
    lines.append(f"  peak memory per {per}: " + " / ".join(f"{(p or 0) / 2**20:.0f} MiB" for p in peak))
    lines.append(f"  report: {out / 'summary.json'}, per-iteration lines {out}/iterations.rank*.jsonl, "
                 f"Gantt of measured units {out / 'gantt.png'}")
    return "\n".join(lines)


def _where(i: int, summary: dict[str, Any]) -> str:
    """The i-th per-GPU entry: "stage s", or with data-parallel replicas (replica-major) "replica d stage s"."""
    dp, stages = (summary.get("job") or {}).get("data_parallel", 1), summary.get("stages") or 1
    return f"stage {i}" if dp < 2 else f"replica {i // stages} stage {i % stages}"


def _job_lines(job: dict[str, Any] | None, energy: str) -> list[str]:
    """Data-parallel replicas: per-node energy, replica times, straggler, all-reduce vs simulated tail."""
    if not job or job.get("data_parallel", 1) < 2:
        return []
    nodes = " / ".join("n/a" if n["energy_per_iteration_j"] is None else f"{n['energy_per_iteration_j']:.1f}"
                       for n in job["energy_per_node_j"])
    times = " / ".join(_ms(r["pipeline_time_s"]) for r in job["replicas"])
    straggler = job.get("straggler_replica")
    seen = "none" if straggler is None else f"replica {straggler} (seen in {job.get('straggler_seen_in')})"
    lines = [
        f"  job: DP{job['data_parallel']} x PP{job['gpus'] // job['data_parallel']}, {job['gpus']} GPUs on "
        f"{job['nodes']} node(s); energy per node ({energy}): {nodes} J; plans identical across replicas: "
        f"{job['plans_identical_across_replicas']}",
        f"  replicas' units end (measured, median): {times}; straggler: {seen}",
    ]
    rule = job.get("straggler_rule")
    if rule:
        lines.append(
            "  straggler rule: " + (f"the other replicas run a frontier plan of {_ms(rule['predicted_time_s'])} "
                                    f"(simulated) within the straggler's {_ms(rule['straggler_predicted_time_s'])}"
                                    if rule.get("applied") else f"not applied ({rule.get('reason')})")
        )
    for a in job.get("allreduce", []):
        reduce = " / ".join(_ms(x) for x in a["measured_allreduce_s"])
        tail = " / ".join(_ms(x) for x in a["measured_tail_s"])
        lines.append(f"  stage {a['stage']} per replica (measured): all-reduce {reduce}, tail {tail}; "
                     f"simulated tail {_ms(a['simulated_tail_s'])}")
    return lines

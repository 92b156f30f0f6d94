"""The accuracy table of `envpipe search`: predicted (simulated) against measured iteration time and peak
memory per stage, from benchmarks/search_run.py's JSON files (OUT/<model>/runs/*.json).

    python benchmarks/search_results.py OUT --command "CPU=1 bash benchmarks/search_h200.sh" > search.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

MIB = 1 << 20


def _error(measured: float, predicted: float) -> float:
    """Prediction error relative to the measurement (Aceso's convention)."""
    return (predicted - measured) / measured


def model_section(model_dir: Path) -> tuple[list[str], list[float], list[float]]:
    profile = json.loads((model_dir / "layers.json").read_text())
    m = profile["model"]
    lines = [f"### {model_dir.name}: {m['family']} {m['layers']} blocks, hidden {m['hidden']}, {m['heads']} heads, "
             f"seq {m['seq']}, vocab {m['vocab']} ({profile['dtype']})", "",
             f"Layer profile measured on {profile['device']} at {profile['date']} (micro-batch sizes "
             f"{profile['micro_batch_sizes']}); clocks: {profile['clocks']['label']}.", "",
             "| configuration | P | D | b | M | stage layers | order that ran | iteration predicted (ms) | measured "
             "median (ms) | error | measured least (ms) | error vs least | peak memory per stage predicted (MiB) | "
             "measured (MiB) | worst error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    time_errors, memory_errors = [], []
    for path in sorted((model_dir / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        s, pred, meas = run["shape"], run["predicted"], run["measured"]
        # the prediction of what ran: the plan, or (clocks not under control) 1F1B at the top clock
        predicted_s = pred["iteration_time_s"] if meas["ran"] == "plan" else pred["baseline_iteration_time_s"]
        order = pred["order"] if meas["ran"] == "plan" else "1f1b (baseline ran)"
        t_err = _error(meas["iteration_time_s"], predicted_s)
        least_err = _error(meas["iteration_time_least_s"], predicted_s)
        # measured: the allocator's peak; predicted alike (runs before the device-level model had only one)
        pred_peaks = pred.get("peak_allocated_bytes_per_stage", pred["peak_memory_bytes_per_stage"])
        m_errs = [_error(m, p) for m, p in zip(meas["peak_memory_bytes_per_stage"], pred_peaks, strict=True)]
        worst = max(m_errs, key=abs)
        time_errors.append(t_err)
        memory_errors.append(worst)
        lines.append(
            f"| {path.stem} | {s['stages']} | {s['replicas']} | {s['micro_batch']} | {s['microbatches']} | "
            f"{','.join(map(str, s['stage_layers']))} | {order} | {predicted_s * 1e3:.1f} | "
            f"{meas['iteration_time_s'] * 1e3:.1f} | {100 * t_err:+.1f}% | "
            f"{meas['iteration_time_least_s'] * 1e3:.1f} | "
            f"{100 * least_err:+.1f}% | {' / '.join(f'{b / MIB:.0f}' for b in pred_peaks)} | "
            f"{' / '.join(f'{b / MIB:.0f}' for b in meas['peak_memory_bytes_per_stage'])} | {100 * worst:+.1f}% |")
    for failed in sorted((model_dir / "runs").glob("*.failed")):
        lines.append(f"| {failed.stem} | failed: {failed.read_text().strip()} |")
    return lines, time_errors, memory_errors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--command", default="")
    args = p.parse_args()
    out = Path(args.out)
    links = json.loads((out / "links.json").read_text())
    print("# envpipe search: predicted vs measured (Aceso-style)\n")
    print(f"Command: `{args.command}`\n")
    print("Machine:\n```\n" + (out / "machine.txt").read_text().strip() + "\n```\n")
    print(f"Links (benchmarks/search_links.py, {links['backend']}, {links['date']}; {links['label']}): p2p latency "
          f"{links['p2p_latency_us']:.0f} us, p2p {links['p2p_gbps']:.2f} GB/s, all-reduce bus "
          f"{links['allreduce_bus_gbps']:.2f} GB/s.\n")
    print("Predicted: simulated by `envpipe search` from the layer profile (per-layer times and memory, measured) "
          "and the links, for what ran: the plan with its clocks where the clocks are under control (the CPU's sim "
          "clock), else 1F1B with every unit at the top clock (GPUs without envpipe-clockd run that and report the "
          "plan). Peak memory: with the plan's order. Measured: examples/train_gpt.py's model and found "
          "configuration, EnvPipe runtime; iteration time per steady iteration = the slowest rank; peak memory = "
          "the allocator's peak per stage, from before the model is built, the plan's order run "
          "(benchmarks/search_run.py). Error = (predicted - measured) / measured.\n")
    all_t, all_m = [], []
    for model_dir in sorted(d for d in out.iterdir() if (d / "layers.json").exists()):
        lines, t_errs, m_errs = model_section(model_dir)
        all_t += t_errs
        all_m += m_errs
        print("\n".join(lines) + "\n")
    if all_t:
        print(f"Over {len(all_t)} runs: iteration time |error| median {100 * statistics.median(map(abs, all_t)):.1f}%, "
              f"max {100 * max(map(abs, all_t)):.1f}%; peak memory |error| median "
              f"{100 * statistics.median(map(abs, all_m)):.1f}%, max {100 * max(map(abs, all_m)):.1f}%.")


if __name__ == "__main__":
    main()

"""Render the runtime benchmark's output directory (benchmarks/runtime_h200.sh) as Markdown tables.

    python benchmarks/runtime_results.py OUT [--command "..."] > benchmarks/results/runtime_h200.md

OUT holds machine.txt and one folder per stage count with bench.json (benchmarks/runtime_bench.py).
Every number is labelled: measured (wall clock, NVML counter) or simulated (planner, frequency model).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def _f(x: Any, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _gib(xs: list[int | None] | None) -> str:
    return " / ".join(_f((x or 0) / 2**30, 1) for x in xs) if xs else "—"


def _per_gpu(xs: list[float] | None) -> str:
    return " / ".join(_f(x, 1) for x in xs) if xs else "—"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(*header: str) -> list[str]:
    return [_row(*header), _row(*["---"] * len(header))]


def _median(runs: list[dict], key: str) -> float | None:
    xs = [r[key] for r in runs if r and r.get(key) is not None]
    return statistics.median(xs) if xs else None


def comparison(bench: dict) -> list[str]:
    rows = _table(
        "stages", "M", "stock iteration (s)", "runtime 1F1B iteration (s)",
        "throughput ratio runtime/stock: median (min–max; per round)",
        "engine alone/stock: median (min–max)", "energy / iteration stock → runtime (J)",
        "per GPU stock (J)", "per GPU runtime (J)", "peak memory stock (GiB)", "peak memory runtime (GiB)",
    )  # fmt: skip
    for run in bench["runs"]:
        stock = [r["stock"] for r in run["rounds"]]
        rt = [r["runtime_1f1b"] for r in run["rounds"]]
        ratio = run["throughput_ratio"]
        per_round = ", ".join(_f(x, 3) for x in ratio["per_round"])
        energy = f"{_f(_median(stock, 'energy_per_iteration_j'), 1)} → {_f(_median(rt, 'energy_per_iteration_j'), 1)}"
        eng = run.get("engine_ratio")
        bare = f"{_f(eng['median'], 3)} ({_f(eng['min'], 3)}–{_f(eng['max'], 3)})" if eng else "—"
        rows.append(_row(
            bench["stages"], run["M"], _f(_median(stock, "iteration_time_s")), _f(_median(rt, "iteration_time_s")),
            f"**{_f(ratio['median'], 3)}** ({_f(ratio['min'], 3)}–{_f(ratio['max'], 3)}; {per_round})", bare, energy,
            _per_gpu(stock[-1].get("energy_per_gpu_j")), _per_gpu(rt[-1].get("energy_per_gpu_j")),
            _gib(stock[-1].get("peak_memory_bytes_per_stage")), _gib(rt[-1].get("peak_memory_bytes_per_stage")),
        ))  # fmt: skip
    return rows


def prediction(bench: dict) -> list[str]:
    rows = _table(
        "stages", "M", "order", "measured iteration (s)", "predicted (s)", "measured vs predicted",
        "transfer (ms)", "tail per stage (ms)", "energy / iteration (J)", "peak memory (GiB)",
    )  # fmt: skip
    for run in bench["runs"]:
        for name, s in [("1F1B", run["rounds"][-1]["runtime_1f1b"]), ("EnvPipe", run.get("runtime_envpipe"))]:
            if not s:
                continue
            cal = s["calibration"]
            err = s.get("predicted_error")
            rows.append(_row(
                bench["stages"], run["M"], name, _f(s["iteration_time_s"]), _f(s.get("predicted_iteration_time_s")),
                "—" if err is None else f"{100 * err:+.1f}%", _f(1e3 * cal["transfer_s"], 2),
                " / ".join(_f(1e3 * t, 1) for t in cal["tail_s"]), _f(s.get("energy_per_iteration_j"), 1),
                _gib(s.get("peak_memory_bytes_per_stage")),
            ))  # fmt: skip
    return rows


def units(bench: dict) -> list[str]:
    rows = _table(
        "stages", "M", "stage", "F (ms)", "B (ms)", "overhead before a unit (ms)",
        "F / B energy (J, counter at unit boundaries)", "last unit ends: measured (ms)", "predicted (ms)",
    )  # fmt: skip
    for run in bench["runs"]:
        s = run["rounds"][-1]["runtime_1f1b"]
        cal, energy, ends = s["calibration"], s.get("unit_energy_per_stage") or [], run.get("stage_ends") or {}
        for st in range(bench["stages"]):
            e = energy[st] if st < len(energy) and energy[st] else {}
            measured = _f(1e3 * ends["measured_s"][st], 1) if ends else "—"
            predicted = _f(1e3 * ends["predicted_s"][st], 1) if ends else "—"
            rows.append(_row(
                bench["stages"], run["M"], st, _f(1e3 * cal["fwd_s"][st], 2), _f(1e3 * cal["bwd_s"][st], 2),
                _f(1e3 * cal["gap_s"][st], 2), f"{_f(e.get('F_j'), 2)} / {_f(e.get('B_j'), 2)}", measured, predicted,
            ))  # fmt: skip
    return rows


def plans(bench: dict) -> list[str]:
    out = []
    for run in bench["runs"]:
        p = run.get("deployable_plan")
        if not p:
            continue
        idle = "simulated" if bench["device"] == "cpu" else "measured on the idle GPU before the runs"
        out += [
            f"**{bench['stages']} stages, M = {run['M']}** ({p['label']}; idle power {p['idle_power_w']:.0f} W, "
            f"{idle}): r_s = {p['reschedule']}, valley clocks {p['valley_mhz']} MHz; predicted "
            f"{_f(p['predicted_time_s'])} s and {_f(p['predicted_energy_j'], 1)} J vs baseline "
            f"{_f(p['baseline_time_s'])} s and {_f(p['baseline_energy_j'], 1)} J: saving {100 * p['saving']:.1f}%, "
            f"slowdown {100 * p['slowdown']:+.1f}% (simulated).",
            "",
            "```",
            p["trace"],
            "```",
            "",
        ]
    return out


def render(out_dir: Path, command: str | None) -> str:
    benches = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*/bench.json"))]
    if not benches:
        raise SystemExit(f"{out_dir}: no */bench.json (run benchmarks/runtime_h200.sh first)")
    machine = (
        (out_dir / "machine.txt").read_text().strip() if (out_dir / "machine.txt").exists() else "(no machine.txt)"
    )
    b0 = benches[0]
    lines = [
        "# Runtime on H200: stock DeepSpeed 1F1B vs the EnvPipe runtime (measured)",
        "",
        f"Run started {b0['started_utc']} UTC on {b0['device']}; model arguments `{' '.join(b0['model_args'])}`; "
        f"{b0['steps']} measured iterations per run, stock and runtime interleaved {b0['rounds']} times per M "
        "(in reverse order every other round). "
        "Clocks were never changed (the runtime records clock requests only); energy is the NVML cumulative "
        "energy counter (measured), per unit interpolated at unit boundaries from a "
        f"{b0['meter_period_s'] * 1e3:.0f} ms poll.",
        "",
        f"Command: `{command or 'OUT=... bash benchmarks/runtime_h200.sh'}`",
        "",
        "Machine:",
        "```",
        machine,
        "```",
        "",
        "## Throughput, energy and memory: stock vs runtime (1F1B order), measured",
        "",
    ]
    for b in benches:
        lines += comparison(b)
    lines += ["", "## Predicted vs measured iteration time (runtime, calibrated transfer and tail), measured", ""]
    for b in benches:
        lines += prediction(b)
    lines += ["", "## Unit times per stage (default clock), measured, and the simulator's stage ends", ""]
    for b in benches:
        lines += units(b)
    lines += ["", "## The plan the planner would deploy (issue 8; simulated below the default clock)", ""]
    for b in benches:
        lines += plans(b)
    counter = [r["rounds"][-1]["runtime_1f1b"].get("energy_counter_update_s") for b in benches for r in b["runs"]]
    counter = [c for c in counter if c]
    if counter:
        lines += [
            "NVML energy counter update period seen by the meter (median, measured): "
            f"{1e3 * statistics.median(counter):.1f} ms.",
            "",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--command", help="the command that produced OUT (recorded in the file)")
    args = p.parse_args(argv)
    print(render(args.out, args.command), end="")


if __name__ == "__main__":
    main()

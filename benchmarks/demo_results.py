"""`make demo`'s result, kept: one run's raw files, and the Markdown and Gantt picture rendered from them (README's
picture and the first row of its results table).

    python -m benchmarks.demo_results measure DIR            run `make demo`, keep its raw files in DIR
    python -m benchmarks.demo_results render DIR [--gantt PNG]   print the Markdown; draw the Gantt picture

The run's raw files: summary.json and report.txt (the runtime's), rank 0's per-iteration lines, rank 0's output
(demo.log) and run.json (the command, the commit, when, the machine and its load). Everything in the demo's
report is of a simulated GPU (the CPU drives `envpipe.simgpu`, whose hidden truth is a measured clock-swept
table) except the host's wall-clock throughput; two runs print the same numbers to the bit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, machine_line, md_row, md_table, shown_path
from envpipe.runtime.summary import RunSummary, Spread

RAW = RESULTS / "demo_runs" / "cpu_2026-11-28"
GANTT = RESULTS / "demo_gantt.png"
COMMAND = ["make", "-s", "demo"]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def measure(out: Path) -> None:
    """`make demo` in this checkout, its raw files copied to ``out``."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"demo_results: {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="demo_") as tmp:
        started, before, t0 = dt.datetime.now(dt.UTC), loadavg(), time.monotonic()
        proc = subprocess.run([*COMMAND, f"OUTDIR={tmp}"], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "MAKEFLAGS": ""})
        wall, after = time.monotonic() - t0, loadavg()
        if proc.returncode != 0:
            raise SystemExit(f"demo_results: make demo failed (exit {proc.returncode}): {proc.stderr[-500:]}")
        runtime = Path(tmp) / "runtime"
        for name in ("summary.json", "report.txt", "iterations.rank0.jsonl"):
            shutil.copy(runtime / name, out / name)
    (out / "demo.log").write_text(proc.stdout)
    run = {"command": " ".join(COMMAND), "commit": commit, "started": f"{started:%Y-%m-%d %H:%M} UTC",
           "wall_s": round(wall, 1), "machine": machine_line(), "load_before": before, "load_after": after}
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    print(f"make demo: {wall:.1f} s; raw files in {out}")


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _spread(s: Spread) -> str:
    return f"{_pct(s.median)} (quartiles {_pct(s.q1)} to {_pct(s.q3)}, {s.n} pairs)"


def render(raw: Path) -> str:
    summary = RunSummary.load(raw / "summary.json")
    run: dict[str, Any] = json.loads((raw / "run.json").read_text())
    m, p, o, plan = summary.measured, summary.predicted, summary.oracle, summary.plan
    if m is None or m.energy_saving is None or p is None or o is None or plan is None:
        raise SystemExit(f"demo_results: {raw / 'summary.json'} has no measured comparison, prediction or oracle")
    gpu = summary.clock.energy  # "simulated GPU"
    lines = [
        "# `make demo`: what EnvPipe saved on the demo's simulated GPU", "",
        f"One run of `{run['command']}` (GPT-2, {summary.stages} pipeline stages on {summary.stages} CPU processes, "
        f"{summary.microbatches} micro-batches, {summary.clock.kind} clock), commit {run['commit'][:9]}, "
        f"{run['started']}, {run['wall_s']:.0f} s wall clock, load {run['load_before'][0]:.1f} before and "
        f"{run['load_after'][0]:.1f} after. Machine: {run['machine']}.", "",
        "Each process drives a simulated GPU that the planner cannot see into: its hidden truth is a measured "
        f"clock-swept table ({o.source}), every unit's time and power drawn from it with seeded noise. So every "
        f"energy and time below is **{gpu}** (two runs give the same numbers to the bit); only the host's "
        "throughput is measured.", "",
        *md_table("figure", "value", "what it is for"),
        md_row("**the result: energy saved, this run**", f"**{_spread(m.energy_saving)}**",
               "the plan's iterations against this run's own interleaved 1F1B all-max iterations (ABBA pairs): "
               f"what EnvPipe saved ({gpu})"),
        md_row("time, same pairs", _spread(m.slowdown), f"the price in iteration time ({gpu}); the budget was no "
               "slowdown"),
        md_row("the planner's prediction", _pct(p.energy_saving), "the plan against its own 1F1B all-max baseline, "
               f"both simulated on the profile the run measured ({p.profile}): what profiling and planning "
               "expected"),
        md_row("the oracle", _pct(o.energy_saving), "a planner knowing the simulated GPU's hidden truth, against "
               "the same baseline on that truth: the most this budget allows"),
        md_row("this run's plan on the truth", _pct(o.planner_energy_saving), "the plan that ran, evaluated on "
               "the hidden truth: how close profiling got to the oracle"),
        "",
        f"Plan: policy {plan.policy}, order {plan.order}; steady iterations "
        f"{1000 * summary.steady.time_s.median:.1f} ms ({summary.clock.time}).", "",
        f"![the Gantt picture of the plan's last iteration]({GANTT.name})", "",
        f"The picture ([{GANTT.name}]({GANTT.name})) shows the units of the plan's last timed iteration, as the "
        "runtime measured them on the simulated GPU: one row per stage, each unit coloured by its SM clock. Stage "
        "0 runs the units off the critical path slower and finishes them inside the bubbles that follow them.", "",
        f"Raw files: `{shown_path(raw)}/` (summary.json, report.txt, rank 0's iterations and output, run.json). "
        f"Rendered by `python -m benchmarks.demo_results render {shown_path(raw)}`, the picture with "
        f"`--gantt {shown_path(GANTT)}`.",
    ]
    return "\n".join(lines) + "\n"


def draw(raw: Path, png: Path) -> Path:
    """The runtime's own Gantt picture of the run (envpipe.runtime.report.files.draw_gantt), from its summary."""
    from envpipe.runtime.report.files import draw_gantt

    draw_gantt(RunSummary.load(raw / "summary.json"), png)
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("measure").add_argument("dir", type=Path)
    r = sub.add_parser("render")
    r.add_argument("dir", type=Path)
    r.add_argument("--gantt", type=Path, help="also draw the Gantt picture here (.png)")
    args = p.parse_args(argv)
    if args.cmd == "measure":
        measure(args.dir)
        return 0
    sys.stdout.write(render(args.dir))
    if args.gantt is not None:
        draw(args.dir, args.gantt)
    return 0


if __name__ == "__main__":
    sys.exit(main())

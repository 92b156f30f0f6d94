"""What the launcher's supervisor costs: time to run a command under it against running it directly,
and time from SIGTERM to none of a job's processes running. Writes a new dated file beside
benchmarks/results/supervise.md (`--update` overwrites that one).

Measured (not simulated), side by side in one run, medians of --repeat runs each: real processes on
this machine (`envpipe_launch.supervise.Supervised`, `subprocess`), no DeepSpeed (whose runner alone
starts in seconds, so the supervisor's share of a real launch is smaller still).

Usage: PYTHONPATH=.:launcher python benchmarks/bench_supervise.py [--repeat 20] [--update | --out FILE]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import psutil
from envpipe_launch.supervise import Supervised

from benchmarks.common import add_output_options, header, write_results

SLEEPERS = 8


def direct_s() -> float:
    t0 = time.perf_counter()
    subprocess.run(["true"], check=True)
    return time.perf_counter() - t0


def supervised_s() -> float:
    t0 = time.perf_counter()
    assert Supervised(["true"]).wait() == 0
    return time.perf_counter() - t0


def stop_s() -> float:
    """SIGTERM to a job of SIGTERM-abiding sleepers, until the supervisor returns (all gone)."""
    job = Supervised(["bash", "-c", f"for i in $(seq {SLEEPERS}); do sleep 60 & done; wait"])
    sup = psutil.Process(job.pid)
    while len(sup.children(recursive=True)) < SLEEPERS + 1:
        time.sleep(0.01)
    t0 = time.perf_counter()
    job.signal(signal.SIGTERM)
    job.wait()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    add_output_options(ap, "supervise.md")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows = {}
    for name, fn in (("`true` run directly (subprocess)", direct_s), ("`true` run under the supervisor", supervised_s),
                     (f"SIGTERM to {SLEEPERS} sleeping processes until all are gone", stop_s)):
        times = [fn() for _ in range(args.repeat)]
        rows[name] = (statistics.median(times), min(times), max(times))
        print(f"{name}: median {rows[name][0] * 1e3:.1f} ms", file=sys.stderr)
    lines = [
        header("envpipe-launch: supervisor overhead (measured)"),
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        "| what | median (ms) | min (ms) | max (ms) |",
        "|---|---:|---:|---:|",
        *(f"| {k} | {m * 1e3:.1f} | {lo * 1e3:.1f} | {hi * 1e3:.1f} |" for k, (m, lo, hi) in rows.items()),
        "",
        f"{args.repeat} runs each, load average {load:.1f} at the start (a machine shared with other jobs). "
        "The supervisor's start is a Python interpreter with psutil; the stop is "
        "bounded by its 50 ms poll while processes exit.",
    ]
    write_results(args, "\n".join(lines))


if __name__ == "__main__":
    main()

"""Run envpipe-clockd with the ``readonly`` backend on a real GPU machine and write a report.

Real NVML reads (GPUs by UUID, supported clocks, current clock, energy counter); lock requests go
through the whole daemon (lease, allow-list, snapping, audit) and are recorded, never applied.
Usage: python benchmarks/clockd_results.py readonly OUT.md
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
import urllib.request
from datetime import UTC, datetime

from benchmarks.common import start_clockd
from envpipe.clock.client import ClockClient, list_gpus


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT.md", help="where the report goes")


def main(args: argparse.Namespace) -> None:
    daemon, sock = start_clockd("--backend", "readonly", "--metrics-port", "9464")
    lines = [
        f"# envpipe-clockd readonly backend on a real GPU (measured, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: `{' '.join(platform.uname())}`, {os.cpu_count()} CPUs",
        "",
    ]
    uuid = list_gpus(sock)[0]["uuid"]  # a UUID to lease, learnt without a lease
    with ClockClient(sock, gpu_uuids=[uuid]) as client:
        listed = client.gpus()
        lines += [
            "## GPUs (GET /v1/gpus)",
            "",
            "| uuid | name | supported SM clocks | current | energy (mJ) |",
            "|---|---|---|---|---|",
        ]
        for g in listed:
            s = g["supported_mhz"]
            lines.append(
                f"| {g['uuid']} | {g['name']} | {len(s)} clocks, {s[-1]}–{s[0]} MHz | "
                f"{g['current_mhz']} MHz | {g['energy_mj']} |"
            )
        e0, t0 = client.energy_mj(uuid), time.monotonic()
        time.sleep(1.0)
        e1, t1 = client.energy_mj(uuid), time.monotonic()
        lines += [
            "",
            f"Energy counter over {t1 - t0:.2f} s: {e1 - e0} mJ = {(e1 - e0) / 1000 / (t1 - t0):.1f} W "
            "average (idle GPU).",
            "",
        ]
        target = listed[0]["supported_mhz"][len(listed[0]["supported_mhz"]) // 2]
        before = listed[0]["current_mhz"]
        reply = client.lock_now(uuid, target + 3)
        after = next(g for g in client.gpus() if g["uuid"] == uuid)
        lines += [
            "## Lock request (recorded, not applied)",
            "",
            f"Requested {target + 3} MHz → daemon answer `{reply}`.",
            f"SM clock before {before} MHz, after {after['current_mhz']} MHz; the daemon's locked range: "
            f"`{after['locked']}` (what it would hold on the nvml backend).",
            "",
        ]
    metrics = urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=5).read().decode()
    lines += [
        "## /metrics (excerpt)",
        "",
        "```",
        *[m for m in metrics.splitlines() if m.startswith("envpipe_clockd")][:12],
        "```",
        "",
    ]
    daemon.terminate()
    rest, _ = daemon.communicate(timeout=20)
    lines += [
        "## Daemon log (audit lines included)",
        "",
        "```",
        *rest.strip().splitlines()[-20:],
        "```",
        "",
        f"Daemon exit code after SIGTERM: {daemon.returncode}",
    ]
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,clocks.sm,clocks.max.sm", "--format=csv"],
        capture_output=True,
        text=True,
    )
    lines += ["", "## nvidia-smi after the run (clocks untouched)", "", "```", smi.stdout.strip(), "```"]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


"""Helpers shared by the benchmark scripts: where results go and what machine produced them."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{platform.node()}: {os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def header(title: str) -> str:
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"# {title}\n\nRun {now} on {machine_line()}.\n"


def write_result(name: str, text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(text)
    return path


def start_clockd(*args: str, stderr: IO[str] | int = subprocess.STDOUT) -> tuple[subprocess.Popen[str], str]:
    """Start a real `envpipe-clockd` on a fresh Unix socket; return it and the socket once it is ready.

    With the default `stderr`, log lines (start-up resets in the audit log) share stdout and are skipped
    while waiting for the ready line; a daemon that exits first stops the benchmark with its last lines.
    """
    sock = os.path.join(tempfile.mkdtemp(), "clockd.sock")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "envpipe.clock.daemon", *args, "--socket", sock],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert daemon.stdout is not None
    seen = []
    for line in daemon.stdout:
        if '"ready"' in line:
            return daemon, sock
        seen.append(line)
    raise SystemExit("envpipe-clockd exited before it was ready:\n" + "".join(seen[-30:]))

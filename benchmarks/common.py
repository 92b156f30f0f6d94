"""Helpers shared by the benchmark scripts: where results go and what machine produced them."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


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
    return f"{platform.node()}: {os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, " \
           f"Python {platform.python_version()}"


def header(title: str) -> str:
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"# {title}\n\nRun {now} on {machine_line()}.\n"


def write_result(name: str, text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(text)
    return path

"""Helpers shared by the benchmark scripts: where results go and what machine produced them."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, NoReturn

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


def header(title: str, command: str | None = None) -> str:
    """A results file's title and where and when it ran; with `command`, the command line that wrote it."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    written = f" Written by `{command}`." if command else ""
    return f"# {title}\n\nRun {now} on {machine_line()}.{written}\n"


class OneLineErrors(argparse.ArgumentParser):
    """argparse with its usage errors as one line on stderr and exit status 2 (no usage above them; --help still
    prints the usage). Its subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_output_options(parser: argparse.ArgumentParser, name: str, *, positional: bool = False) -> None:
    """`--update` (overwrite the committed benchmarks/results/NAME) or an explicit output path.

    Without either, a run writes a new dated file beside the committed one (`dated_path`), so a run on a
    busy or different machine never silently replaces the numbers the docs quote. `positional` keeps the
    scripts whose usage has always been `script [OUT.md]`.
    """
    group = parser.add_mutually_exclusive_group()
    where = f"instead of a new dated file beside benchmarks/results/{name}"
    if positional:
        group.add_argument("out", nargs="?", type=Path, default=None, help=f"write the results here, {where}")
    else:
        group.add_argument("--out", type=Path, default=None, help=f"write the results here, {where}")
    group.add_argument("--update", action="store_true", help=f"overwrite the committed benchmarks/results/{name}")
    parser.set_defaults(results_name=name)


def dated_path(name: str, now: _dt.datetime | None = None) -> Path:
    """benchmarks/results/<stem>_<UTC time><suffix>, e.g. planner_2026-11-24T103015Z.md (git ignores these)."""
    now = now or _dt.datetime.now(_dt.UTC)
    committed = Path(name)
    return RESULTS / f"{committed.stem}_{now:%Y-%m-%dT%H%M%SZ}{committed.suffix}"


def output_path(args: argparse.Namespace) -> Path:
    """Where this run writes, from the options `add_output_options` added."""
    if args.out is not None:
        return Path(args.out)
    return RESULTS / args.results_name if args.update else dated_path(args.results_name)


def write_results(args: argparse.Namespace, text: str) -> Path:
    """Write a benchmark's results where its options say (`output_path`) and say where they went."""
    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    committed = RESULTS / args.results_name
    if path.resolve() == committed.resolve():
        print(f"results written to {path}")
    else:
        print(f"results written to {path}; {committed.relative_to(ROOT)} unchanged (--update overwrites it)")
    return path


def start_clockd(*args: str, stderr: IO[str] | int = subprocess.STDOUT) -> tuple[subprocess.Popen[str], str]:
    """Start a real `envpipe-clockd` on a fresh Unix socket; return it and the socket once it is ready.

    With the default `stderr`, log lines (start-up resets in the audit log) share stdout and are skipped
    while waiting for the ready line; a daemon that exits first stops the benchmark with its last lines.
    """
    sock = os.path.join(tempfile.mkdtemp(), "clockd.sock")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "envpipe.clock.daemon", "--ownership", "local", *args, "--socket", sock],
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


# --- rendering results from raw files (benchmarks/*_results.py, benchmarks/rendered.py) -------------------


def prediction_error(predicted: float, measured: float) -> float:
    """The one error convention of every results file: (predicted - measured) / measured (Aceso's)."""
    return (predicted - measured) / measured


def md_row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(*header: str) -> list[str]:
    """A Markdown table's header and rule; rows follow from `md_row`."""
    return [md_row(*header), md_row(*["---"] * len(header))]


def shown_path(path: Path) -> str:
    """A raw file's path as a results file names it: relative to the checkout when inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def command_of(raw: Path, default: str) -> str:
    """The command that produced a raw directory (its command.txt) or archive (X.tar.gz: X.command.txt beside it),
    else `default`."""
    recorded = raw / "command.txt" if raw.is_dir() else raw.with_name(raw.name.split(".")[0] + ".command.txt")
    return recorded.read_text().strip() if recorded.is_file() else default

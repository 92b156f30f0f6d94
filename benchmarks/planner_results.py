"""The planner study's results, each written by a run of its benchmark (one command, one subcommand per results
file; the benchmarks are in benchmarks/planner_study/).

    python benchmarks/planner_results.py policies [--update | --out FILE]                    # planner.md
    python benchmarks/planner_results.py optimal [--quick] [--update | --out FILE]            # optimal.md
    python benchmarks/planner_results.py scale [--reference REF] [--quick] [--update | --out FILE]  # planner_scale.md
    python benchmarks/planner_results.py schedules [--microbatches M] [--update | --out FILE]  # schedules.md

Without --update or --out, a run writes a new dated file beside the committed one in benchmarks/results/; the
file names the command line that wrote it. A bad subcommand or option is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.common import OneLineErrors
from benchmarks.planner_study import optimal, policies, scale, schedules


class Benchmark(Protocol):
    """A module of benchmarks/planner_study/: its options, and a run that writes its results file."""

    __doc__: str | None

    def add_arguments(self, ap: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> None: ...


SUBCOMMANDS: dict[str, Benchmark] = {"policies": policies, "optimal": optimal, "scale": scale,
                                     "schedules": schedules}


def parser() -> argparse.ArgumentParser:
    p = OneLineErrors(prog="planner_results.py", description=__doc__.split("\n\n")[0])
    kinds = p.add_subparsers(dest="kind", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, benchmark in SUBCOMMANDS.items():
        summary = " ".join((benchmark.__doc__ or "").split("\n\n")[0].split())
        benchmark.add_arguments(kinds.add_parser(name, help=summary, description=summary))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    args.command = shlex.join(["python", "benchmarks/planner_results.py", *argv])
    SUBCOMMANDS[args.kind].run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

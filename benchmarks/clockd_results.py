"""The envpipe-clockd study's benchmarks and results, one command (a subcommand per results file; the benchmarks
are in benchmarks/clockd_study/).

    python benchmarks/clockd_results.py fair [--seconds S] [--update | --out OUT.md]   # clockd_fair.json and .md
    python benchmarks/clockd_results.py fair-render RAW.json                          # the Markdown of a fair run
    python benchmarks/clockd_results.py faults [OUT.md | --update]                    # clockd_faults.md
    python benchmarks/clockd_results.py latency [OUT.md | --update]                   # clockd_latency.md
    python benchmarks/clockd_results.py readonly OUT.md                                # on a GPU machine

Without OUT.md or --update, a benchmark writes a new dated file beside its committed one. Bad input (an unknown
subcommand or option, a raw file that is missing or not a fair run's) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.clockd_study import fair, faults, latency, readonly
from benchmarks.common import OneLineErrors


def _raw_run(path: str) -> dict[str, Any]:
    try:
        return fair.load(Path(path))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _render_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("raw", type=_raw_run, metavar="RAW.json", help="a fair run's raw results")


def _render(args: argparse.Namespace) -> None:
    sys.stdout.write(fair.render(args.raw) + "\n")


@dataclass(frozen=True)
class Subcommand:
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]


SUBCOMMANDS = {
    "fair": Subcommand("8 well-behaved clients alone and beside an abusive one: raw JSON and its Markdown",
                       fair.add_options, fair.main),
    "fair-render": Subcommand("print the Markdown of a fair run's raw JSON", _render_options, _render),
    "faults": Subcommand("lock latency with slow connections, resets after deaths, a hung GPU",
                         faults.add_options, faults.main),
    "latency": Subcommand("lock-request round trips and the rate of concurrent clients",
                          latency.add_options, latency.main),
    "readonly": Subcommand("the readonly backend on a real GPU machine", readonly.add_options, readonly.main),
}


def main(argv: list[str] | None = None) -> int:
    p = OneLineErrors(description=__doc__.split("\n\n")[0])
    kinds = p.add_subparsers(dest="kind", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, sub in SUBCOMMANDS.items():
        sub.add_options(kinds.add_parser(name, help=sub.help, description=sub.help))
    args = p.parse_args(argv)
    SUBCOMMANDS[args.kind].run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The search study's results, rendered from raw files as Markdown (one command, a subcommand per kind of raw
folder or round; the renderers are in benchmarks/search_study/).

    python benchmarks/search_results.py two-gpu OUT [OUT ...] [--command "CPU=1 bash benchmarks/search_h200.sh"]
    python benchmarks/search_results.py call1    > benchmarks/results/search_accuracy.md
    python benchmarks/search_results.py call3    > benchmarks/results/search_accuracy_call3.md
    python benchmarks/search_results.py call4    > benchmarks/results/search_accuracy_call4.md
    python benchmarks/search_results.py call6    > benchmarks/results/search_accuracy_call6.md
    python benchmarks/search_results.py call7    > benchmarks/results/search_accuracy_call7.md
    python benchmarks/search_results.py call8    > benchmarks/results/search_accuracy_call8.md

two-gpu: benchmarks/search_h200.sh's work directories or their .tar.gz (search.md, search_h100x2.md); the command
that produced an OUT is --command, else its command.txt (for X.tar.gz: X.command.txt beside it). callN: a round of
the one-GPU held-out study (benchmarks/search_accuracy.py), read from its committed raw files under
benchmarks/results/search_accuracy/; it takes no arguments. Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.common import OneLineErrors
from benchmarks.search_study import call1, call3, call4, call6, graphed, twogpu

ROUNDS: dict[str, Callable[[], str]] = {"call1": call1.render, "call3": call3.render, "call4": call4.render,
                                        "call6": call6.render, "call7": graphed.render_call7,
                                        "call8": graphed.render_call8}  # by the round's first call


def _render(args: argparse.Namespace) -> str:
    if args.kind == "two-gpu":
        if not args.out:
            raise ValueError("two-gpu: give at least one OUT (a work directory or its .tar.gz)")
        return twogpu.render([Path(o) for o in args.out], args.command)
    if args.out or args.command is not None:
        raise ValueError(f"{args.kind}: takes no arguments (it reads benchmarks/results/search_accuracy/)")
    return ROUNDS[args.kind]()


def main(argv: list[str] | None = None) -> int:
    p = OneLineErrors(prog="search_results.py", description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=["two-gpu", *ROUNDS], help="the kind of raw folder or round (see the usage above)")
    p.add_argument("out", nargs="*", default=[], metavar="OUT", help="two-gpu: the work directories or archives")
    p.add_argument("--command", default=None, help="two-gpu: the command that produced OUT (default: its command.txt)")
    args = p.parse_args(argv)
    try:
        text = _render(args)
    except (OSError, ValueError, KeyError) as e:
        print(f"search_results.py: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

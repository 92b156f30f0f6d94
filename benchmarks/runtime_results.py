"""The runtime-vs-stock study's results, rendered from raw folders as Markdown (one command, one kind of raw
folder per subcommand; the renderers are in benchmarks/runtime_study/).

    python benchmarks/runtime_results.py rounds OUT [--command "..."]   # runtime_h200.sh (2026-11-23 on)
    python benchmarks/runtime_results.py rounds RAW...                 # the raw folders of 2026-11-22
    python benchmarks/runtime_results.py dropin OUT [OUT ...]          # runtime_bench.py
    python benchmarks/runtime_results.py dp OUT [OUT ...]              # dp_h200.sh: a results file
    python benchmarks/runtime_results.py dp-table OUT RUN [RUN ...]    # dp_h200.sh: one folder's table
    python benchmarks/runtime_results.py ablation OUT [OUT ...]        # dropin_ablation.py

A folder that is not of its subcommand's kind is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.runtime_study import ablation, dp, dropin, rounds


def _rounds(args: argparse.Namespace) -> str:
    raws = [Path(r) for r in args.folders]
    if len(raws) == 1 and rounds.is_typed(raws[0]):
        try:
            return rounds.render(raws[0], args.command)
        except ValueError as e:  # a bench.json the RunSummary type cannot read (summary schema changed)
            raise ValueError(f"{raws[0]}: {e}") from None
    if all(rounds.is_nov22(r) for r in raws):
        missing = [str(r) for r in raws if not (r / "machine.txt").is_file()]
        if missing:
            raise ValueError(f"not a raw run directory (no machine.txt): {', '.join(missing)}")
        return rounds.render_nov22(raws)
    bad = next((r for r in raws if not rounds.is_nov22(r)), raws[0])
    raise ValueError(f"{bad}: no */bench.json (run benchmarks/runtime_h200.sh first); give one such folder, "
                     "or the raw folders of 2026-11-22")


def _needs(file: str, made_by: str) -> Callable[[list[Path]], list[Path]]:
    def check(outs: list[Path]) -> list[Path]:
        for out in outs:
            if not (out / file).is_file():
                raise ValueError(f"{out}/{file}: no such file (run {made_by})")
        return outs
    return check


def _dp_table(args: argparse.Namespace) -> str:
    out, *runs = args.folders
    if not runs:
        raise ValueError("dp-table: give OUT and at least one RUN (a report directory name under OUT)")
    return dp.table(Path(out), runs)


SUBCOMMANDS: dict[str, Callable[[argparse.Namespace], str]] = {
    "rounds": _rounds,
    "dropin": lambda a: dropin.render_all(_needs("bench.json", "benchmarks/runtime_bench.py")(
        [Path(f) for f in a.folders])),
    "dp": lambda a: dp.render([Path(f) for f in a.folders]),
    "dp-table": _dp_table,
    "ablation": lambda a: ablation.render(_needs("ablation.json", "benchmarks/dropin_ablation.py")(
        [Path(f) for f in a.folders])),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=list(SUBCOMMANDS), help="the kind of raw folder (see the usage above)")
    p.add_argument("folders", nargs="+", metavar="FOLDER")
    p.add_argument("--command", default=None, help="rounds: the command that produced OUT (default: OUT/command.txt)")
    args = p.parse_args(argv)
    try:
        text = SUBCOMMANDS[args.kind](args)
    except ValueError as e:
        print(f"runtime_results.py: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The accuracy table of `envpipe search`: predicted (simulated) against measured iteration time and peak
memory per stage, from benchmarks/search_run.py's JSON files (OUT/<model>/runs/*.json).

    python benchmarks/search_results.py OUT [OUT...] [--command "CPU=1 bash benchmarks/search_h200.sh"] > search.md

OUT is benchmarks/search_h200.sh's work directory or its search_runs.tar.gz (machine.txt, links.json, one folder
per model with layers.json and runs/). The command that produced an OUT: --command, else its command.txt (for
X.tar.gz: X.command.txt beside it). Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.search_study.twogpu import render


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="+", type=Path)
    p.add_argument("--command", default=None, help="the command that produced OUT (default: its command.txt)")
    args = p.parse_args(argv)
    try:
        print(render(args.out, args.command), end="")
    except (OSError, ValueError, KeyError) as e:
        print(f"search_results: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

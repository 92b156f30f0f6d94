"""The one-GPU accuracy study of `envpipe search`, every round, rendered from its raw files
(benchmarks/results/search_accuracy/): predicted against measured iteration time and memory per run, with each
round's declaration (committed before its runs), machine and engine model, and the diagnostics the round took.

    python benchmarks/search_accuracy_results.py          > benchmarks/results/search_accuracy.md
    python benchmarks/search_accuracy_results.py call3    > benchmarks/results/search_accuracy_call3.md
    python benchmarks/search_accuracy_results.py call4    > benchmarks/results/search_accuracy_call4.md
    python benchmarks/search_accuracy_results.py call6    > benchmarks/results/search_accuracy_call6.md

The rounds (ROUNDS, by their first call): call1 (calls 1-2), the first held-out run (call2/fit/engine.json
fitted before any held-out run); call3, the second (layer profile v3, per-call costs, two calls' runs, the
host-speed and chain diagnostics taken after it); call4, the third (layer profile v4 scored with no time terms
fitted, and call5: the engine model fitted on call4's runs, scored on two unseen models); call6, the fifth (one
H200: a fit set for this host's engine model and host spread, then two unseen models scored with the search's
host band and regime).
tests/benchmarks/test_search_accuracy.py and benchmarks/rendered.py check that each committed file is reproduced.

Predictions: held-out runs, as `envpipe search` wrote them into each found configuration before the run
(iteration time, the allocator's peak); per unit, the search's own time model (envpipe.search.timing) on the
run's layer profile with the engine model the run was searched with; fit runs, the fitted model's (in sample).
Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_study import call1, call3, call4, call6

ROUNDS = {"call1": call1.render, "call3": call3.render, "call4": call4.render, "call6": call6.render}  # by first call


def main(argv: list[str]) -> int:
    round_ = argv[0] if argv else "call1"
    if len(argv) > 1 or round_ not in ROUNDS:
        sys.stderr.write(f"usage: search_accuracy_results.py [{'|'.join(ROUNDS)}] (got {' '.join(argv)!r})\n")
        return 2
    sys.stdout.write(ROUNDS[round_]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

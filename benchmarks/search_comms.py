"""What one process group's NCCL communicator holds on the device, measured once per machine for `envpipe search`
(``--communicator-mib``), from a tiny model trained by the EnvPipe runtime in every layout of the machine's GPUs:

    python benchmarks/search_comms.py RUNS --links links.json

RUNS holds benchmarks/search_run.py's results of one configuration per layout (benchmarks/search_h200.sh's
communicators step: P x D = 1 x 1, 2 x 1 and 1 x 2 on two GPUs), each with what every stage's process held
outside the caching allocator at its end (cudaMemGetInfo, each rank alone on its GPU). A rank of a layout of more
than one GPU holds, beyond the one-GPU job's, its process groups' communicators (torch creates one per group of
more than one rank: envpipe.search.cluster.communicators counts them); the tiny model keeps everything else the
same. The measure is their bytes over their count, over every stage of every layout (the least-squares slope
through zero), written into the links file beside each layout's own numbers. On CPU (gloo) no device memory is
held: 0, labelled so. A one-GPU machine has no layout to measure: nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envpipe.atomicfile import atomic_write
from envpipe.search.cluster import communicators

OUTSIDE = "outside_allocator_bytes_per_stage"
COMMUNICATORS = "communicators"  # benchmarks/search_h200.sh's folder of the tiny model's runs, in its work folder


def layouts(runs_dir: Path) -> dict[tuple[int, int], list[int] | None]:
    """(P, D) -> what each stage held outside the allocator (None: not measured, a CPU run)."""
    found: dict[tuple[int, int], list[int] | None] = {}
    for path in sorted(runs_dir.glob("*.json")):
        run = json.loads(path.read_text())
        shape = run["shape"]
        found[(shape["stages"], shape["replicas"])] = run["measured"].get(OUTSIDE)
    return found


def measure(found: dict[tuple[int, int], list[int] | None]) -> dict[str, object]:
    """The links file's ``communicators`` entry from the layouts' runs (one of them 1 x 1)."""
    one = found.get((1, 1))
    if one is None and (1, 1) in found:  # gloo: nothing on a device
        return {"per_group_bytes": 0, "label": "none: no GPU (gloo holds no device memory)"}
    if one is None:
        raise SystemExit("search_comms.py: no 1 x 1 run to compare the layouts with")
    by_layout, held, groups = {}, 0, 0
    for (P, D), outside in sorted(found.items()):
        if (P, D) == (1, 1) or outside is None:
            continue
        extra = [o - one[0] for o in outside]
        count = [communicators(P, D, s) for s in range(P)]
        by_layout[f"P{P}_D{D}"] = {"extra_bytes_per_stage": extra, "communicators_per_stage": count}
        held, groups = held + sum(extra), groups + sum(count)
    if not groups:
        raise SystemExit("search_comms.py: no layout of more than one GPU among the runs")
    return {"per_group_bytes": round(held / groups), "by_layout": by_layout,
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "label": "measured: a tiny model trained by the EnvPipe runtime in each layout, what its ranks held "
                     "outside the allocator beyond one GPU's, over their process groups (benchmarks/search_comms.py)"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, help="benchmarks/search_run.py's results, one per layout")
    p.add_argument("--links", type=Path, required=True, help="benchmarks/search_links.py's JSON, updated in place")
    args = p.parse_args()
    links = json.loads(args.links.read_text())
    links["communicators"] = measure(layouts(args.runs))
    with atomic_write(args.links) as out:
        out.write(json.dumps(links, indent=1) + "\n")
    print(json.dumps(links["communicators"]))


if __name__ == "__main__":
    main()

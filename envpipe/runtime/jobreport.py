"""The job-wide part of the summary: every GPU of every node, per node, per replica, all-reduce, stragglers.

Energy per iteration is the sum over *all* ranks (every stage of every data-parallel replica) of each
rank's median steady-iteration energy; per-node totals group ranks by node. Throughput is the job's
global batch over the job's iteration time (median over iterations of the slowest rank). Every number
carries its label: measured (timers, NVML counter), or simulated (SimClock's model, the planner).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envpipe.runtime.replicas import Place, find_straggler
from envpipe.runtime.report import StageReport, median_energy, slowest_per_iteration


@dataclass
class RankRecord:
    place: Place
    report: StageReport
    plan_digest: str
    pipeline_s: list[float] = field(default_factory=list)  # per steady iteration: end of the last unit
    allreduce_s: list[float] = field(default_factory=list)  # ReduceTiedGrads + ReduceGrads (engine marks)
    tail_s: list[float] = field(default_factory=list)  # step end - last unit end, as calibration measures it


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _total(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def job_summary(
    records: list[RankRecord],
    energy_label: str,
    simulated_tails_s: Sequence[float],
    straggler_threshold: float,
    detected_straggler: int | None = None,
) -> dict[str, Any]:
    """Per node, per replica, per stage all-reduce, the straggler flag, and whether plans agree.

    `detected_straggler`: the replica the runtime found straggling before planning (calibration or
    profiling). It stays flagged when steady times no longer show it, which is what happens when the
    other replicas take the straggler rule's slower, cheaper plan.
    """
    nodes = sorted({(r.place.node_first_rank, r.place.host) for r in records})
    per_node = []
    for i, (first, host) in enumerate(nodes):
        mine = [r for r in records if (r.place.node_first_rank, r.place.host) == (first, host)]
        per_node.append(
            {
                "node": i,
                "host": host,
                "ranks": sorted(r.place.rank for r in mine),
                "energy_per_iteration_j": _total([median_energy(r.report) for r in mine]),
            }
        )
    replicas = sorted({r.place.replica for r in records})
    per_replica: list[dict[str, Any]] = []
    for d in replicas:
        mine = [r for r in records if r.place.replica == d]
        iters = slowest_per_iteration(r.report.times_s for r in mine)
        pipes = slowest_per_iteration(r.pipeline_s for r in mine)
        per_replica.append(
            {
                "replica": d,
                "iteration_time_s": _median(iters),
                "pipeline_time_s": _median(pipes),
                "energy_per_iteration_j": _total([median_energy(r.report) for r in mine]),
            }
        )
    times: dict[int, float] = {
        p["replica"]: p["pipeline_time_s"] for p in per_replica if p["pipeline_time_s"] is not None
    }
    seen = find_straggler(times, straggler_threshold)
    straggler = seen if seen is not None else detected_straggler
    where = "steady iterations" if seen is not None else "calibration/profiling" if straggler is not None else None
    for p in per_replica:
        p["straggler"] = p["replica"] == straggler
    stages = sorted({r.place.stage for r in records})
    allreduce = []
    for s in stages:
        mine = [r for r in records if r.place.stage == s]
        allreduce.append(
            {
                "stage": s,
                "measured_allreduce_s": [_median(r.allreduce_s) for r in mine],
                "measured_tail_s": [_median(r.tail_s) for r in mine],
                "simulated_tail_s": simulated_tails_s[s] if s < len(simulated_tails_s) else None,
            }
        )
    digests = {s: {r.plan_digest for r in records if r.place.stage == s} for s in stages}
    return {
        "data_parallel": len(replicas),
        "gpus": len(records),
        "nodes": len(nodes),
        "energy_per_node_j": per_node,
        "energy_per_node": energy_label,
        "replicas": per_replica,
        "replica_times": "measured (pipeline_time_s: until the replica's last stage ends its units, "
        "before the all-reduce)",
        "straggler_replica": straggler,
        "straggler_seen_in": where,
        "straggler_threshold": straggler_threshold,
        "allreduce": allreduce,
        "allreduce_times": "measured per rank (replica order); tail: step end - last unit end (all-reduce, "
        "optimizer step, loss broadcast); simulated_tail_s: the calibrated tail in the prediction, less the head "
        "(train_batch start to the first unit) that calibration folds into it",
        "plans_identical_across_replicas": all(len(d) == 1 for d in digests.values()),
        "plan_digest_per_rank": {r.place.rank: r.plan_digest for r in records},
    }

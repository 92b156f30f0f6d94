"""Measured unit timings of a pipeline whose true overhead (GAP), transfer, head and tails are known: what
calibration must recover (tests/runtime/test_timing.py, test_dp.py)."""

from __future__ import annotations

import numpy as np

from envpipe.plan.dag import PipelineDag
from envpipe.plan.simulate import Overheads, simulate
from envpipe.runtime.measure.timing import StageTiming

GAP, TRANSFER, HEAD = 0.002, 0.005, 0.003
TAIL = [0.03, 0.02, 0.01]


def measure(orders, fwd, bwd, host0: float = 100.0) -> list[StageTiming]:
    """A pipeline where a unit starts GAP after its stage is free or TRANSFER after its input ended."""
    dag = PipelineDag.from_orders(orders, len(orders[0]) // 2)
    dur = np.where(dag.is_fwd, np.asarray(fwd)[dag.stage], np.asarray(bwd)[dag.stage]) + GAP
    return timings_of(dag, dur, host0)


def timings_of(dag: PipelineDag, dur: np.ndarray, host0: float) -> list[StageTiming]:
    """Each stage's measured iteration of `dag` with unit times `dur` (GAP included) from host0."""
    P = dag.num_stages
    tl = simulate(dag, dur, np.zeros_like(dur), Overheads.broadcast(P, 0.0, TRANSFER - GAP, TAIL[:P]))
    origin = host0 + HEAD  # train_batch starts at host0 on every stage
    out = []
    for s in range(P):
        ids = dag.order[s]
        units = [(*dag.unit(i)[1:], origin + tl.start[i] + GAP, origin + tl.end[i]) for i in ids]
        out.append(StageTiming(s, host0, origin + tl.stage_end[s] + TAIL[s], units))
    return out

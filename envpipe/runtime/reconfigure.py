"""EnvPipe's reconfiguration phase on measured waits.

Each round runs one real iteration with the current clocks, turns the measured units of all stages
into a timeline (`envpipe.runtime.timing.measured_timeline`: each unit's recv stall is its dependency
wait) and hands it to the planner's own loop, `envpipe.plan.reconfig.reconfigure`, which walks
EnvPipe's critical path and raises clocks (greedy: +90 MHz on the latest critical unit below max;
balanced: +30 MHz on every critical unit at the path's minimum clock) until the critical path is the
envelope, nothing on it can be raised, or ``max_rounds`` is reached. The decision is the same on
every rank: all of them see the same gathered measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from envpipe.plan.dag import PipelineDag
from envpipe.plan.reconfig import ReconfigResult, envpipe_critical_path, reconfigure
from envpipe.plan.schedules import Unit
from envpipe.plan.simulate import Timeline


@dataclass
class Round:
    round: int
    clocks: list[list[int]]  # per stage, in execution order
    critical_path: list[tuple[int, str, int]]  # in time order
    iteration_time_s: float  # measured (pipeline start to the last stage's end)


@dataclass
class OnlineReconfig:
    clocks: list[list[int]]
    result: ReconfigResult
    rounds: list[Round] = field(default_factory=list)


def to_dag(dag: PipelineDag, per_stage: Sequence[Sequence[int]]) -> np.ndarray:
    """Per-stage clock lists (execution order) -> one clock per DAG unit."""
    freqs = np.zeros(dag.num_units, np.int64)
    for s, ids in enumerate(dag.order):
        freqs[list(ids)] = per_stage[s]
    return freqs


def per_stage(dag: PipelineDag, freqs: np.ndarray) -> list[list[int]]:
    return [[int(freqs[i]) for i in ids] for ids in dag.order]


def reconfigure_online(
    method: str,
    orders: Sequence[Sequence[Unit]],
    clocks: Sequence[Sequence[int]],
    supported_mhz: Sequence[int],
    run_iteration: Callable[[list[list[int]]], Timeline],
    max_rounds: int = 20,
    threshold_scale: float = 4.0,
) -> OnlineReconfig:
    """Raise clocks on the measured critical path; ``run_iteration(clocks)`` runs and measures one iteration."""
    if max_rounds < 1:
        raise ValueError("the reconfiguration round limit must be at least 1")
    dag = PipelineDag.from_orders(orders, len(orders[0]) // 2)
    top = max(max(c) for c in clocks)
    candidates = np.asarray(sorted({int(f) for f in supported_mhz if f <= top} | {top}))
    rounds: list[Round] = []

    def measure(freqs: np.ndarray, _previous: Timeline | None, _changed: np.ndarray | None) -> Timeline:
        now = per_stage(dag, freqs)
        tl = run_iteration(now)
        path = envpipe_critical_path(tl, threshold_scale)[::-1]
        rounds.append(Round(len(rounds), now, [dag.unit(i) for i in path], float(tl.stage_end.max())))
        return tl

    result = reconfigure(
        dag, to_dag(dag, clocks), candidates, measure, method, threshold_scale, max_rounds=max_rounds
    )
    return OnlineReconfig(per_stage(dag, result.freqs_mhz), result, rounds)

"""Measured unit timings of all stages → the simulator's inputs and a measured timeline.

Every rank contributes a `StageTiming` per iteration (host times: ``time.perf_counter``, shared by
the processes of one machine; GPU event times are mapped to it once per iteration by the engine).
From them:

- `calibrate`: per-stage forward/backward time, the per-unit overhead (recv posting, micro-batch
  load: the gap before a unit that did not wait for data), the p2p transfer time (how long after its
  input's producer ended a data-bound unit started, less that overhead) and each stage's tail (the
  gradient reduction and optimizer step after its last unit, up to the end of the iteration, plus the
  head before the first unit). These are exactly the inputs of `envpipe.plan.simulate.simulate`.
- `measured_timeline`: one iteration as an `envpipe.plan.simulate.Timeline`, with each unit's recv
  stall (at least the transfer time, as EnvPipe's recv events measure it) as its dependency wait,
  so EnvPipe's critical-path walk and reconfiguration (`envpipe.plan.reconfig`) run on measured
  waits instead of simulated ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from envpipe.plan.dag import PipelineDag
from envpipe.plan.schedules import Unit
from envpipe.plan.simulate import Overheads, Timeline, simulate


@dataclass
class StageTiming:
    """One stage's iteration: when train_batch started and ended, and its units, in host time."""

    stage: int
    step_start: float
    step_end: float
    units: list[tuple[str, int, float, float]] = field(default_factory=list)  # kind, mb, start, end


@dataclass(frozen=True)
class SimInputs:
    fwd_s: list[float]  # per stage: mean forward time (each unit's median over iterations), its overhead included
    bwd_s: list[float]
    gap_s: list[float]  # per stage: overhead before a unit that did not wait for data
    transfer_s: float  # p2p transfer beyond that overhead
    tail_s: list[float]  # per stage: after its last unit to the iteration's end (plus the head)
    head_s: float  # from train_batch's start to stage 0's first unit


class _Measured:
    """Host start/end of every DAG unit of one iteration, and each unit's same-stage and input ends."""

    def __init__(self, dag: PipelineDag, stages: Sequence[StageTiming]) -> None:
        N = dag.num_units
        self.start, self.end = np.full(N, np.nan), np.full(N, np.nan)
        for st in stages:
            for kind, mb, a, b in st.units:
                i = dag.index(st.stage, kind, mb)
                self.start[i], self.end[i] = a, b
        if np.isnan(self.start).any():
            raise ValueError("the measured iteration lacks units of some stage")
        ends = np.r_[self.end, np.nan]
        self.first = dag.order[0][0]  # stage 0's first unit starts the pipeline
        self.prev_end = ends[dag.pred_same]  # nan: first unit of its stage
        self.data_end = np.where(dag.data_crosses, ends[dag.pred_data], np.nan)  # nan: no recv
        self.data_bound = self.data_end >= self.free(np.zeros(dag.num_units))

    def origin(self, gap0: float) -> float:
        """The pipeline's start: stage 0's first unit less its per-unit overhead ``gap0``."""
        return self.start[self.first] - gap0

    def free(self, gap: np.ndarray) -> np.ndarray:
        """When each unit's stage was free for it: its previous unit's end, or the pipeline's start."""
        return np.where(np.isnan(self.prev_end), self.origin(gap[self.first]), self.prev_end)

    def stall(self, gap: np.ndarray) -> np.ndarray:
        """Recv stall per unit: time waiting for the input beyond the usual per-unit overhead."""
        wait = self.start - gap - self.free(gap)
        return np.where(self.data_bound, np.maximum(wait, 0.0), 0.0)


def sim_inputs(orders: Sequence[Sequence[Unit]], iterations: Sequence[Sequence[StageTiming]]) -> SimInputs:
    """Simulator inputs from one or more measured iterations of ``orders`` (samples are pooled)."""
    if not iterations:
        raise ValueError("calibration needs at least one measured iteration")
    P, M = len(orders), len(orders[0]) // 2
    dag = PipelineDag.from_orders(orders, M)
    measured = [(_Measured(dag, it), {st.stage: st for st in it}) for it in iterations]
    gaps = []
    for s in range(P):
        mine = dag.stage == s
        samples = [
            x
            for m, _ in measured
            for x in (m.start - m.prev_end)[mine & ~np.isnan(m.prev_end) & ~m.data_bound].tolist()
        ]
        gaps.append(max(0.0, statistics.median(samples)) if samples else 0.0)
    gap = np.asarray(gaps)[dag.stage]
    transfers = [x for m, _ in measured for x in (m.start - m.data_end - gap)[m.data_bound].tolist()]
    dur = np.median(np.array([m.end - m.start for m, _ in measured]), axis=0) + gap  # robust to one slow iteration
    fwd = [float(dur[(dag.stage == s) & dag.is_fwd].mean()) for s in range(P)]
    bwd = [float(dur[(dag.stage == s) & ~dag.is_fwd].mean()) for s in range(P)]
    heads, tails = [], []
    for m, by_stage in measured:
        head = m.origin(gaps[0]) - by_stage[0].step_start
        heads.append(head)
        tails.append([by_stage[s].step_end - m.end[dag.order[s][-1]] + head for s in range(P)])
    return SimInputs(
        fwd,
        bwd,
        gaps,
        max(0.0, statistics.median(transfers)) if transfers else 0.0,
        [max(0.0, float(x)) for x in np.median(np.asarray(tails), axis=0)],
        float(statistics.median(heads)),
    )


def unit_durations(dag: PipelineDag, fwd_s: Sequence[float], bwd_s: Sequence[float]) -> np.ndarray:
    return np.where(dag.is_fwd, np.asarray(fwd_s)[dag.stage], np.asarray(bwd_s)[dag.stage])


def predicted_timeline(orders: Sequence[Sequence[Unit]], cal: SimInputs) -> Timeline:
    """Simulated iteration of ``orders`` with the calibrated unit, transfer and tail times (no energy)."""
    dag = PipelineDag.from_orders(orders, len(orders[0]) // 2)
    dur = unit_durations(dag, cal.fwd_s, cal.bwd_s)
    return simulate(dag, dur, np.zeros_like(dur), Overheads.broadcast(len(orders), 0.0, cal.transfer_s, cal.tail_s))


def predict_time(orders: Sequence[Sequence[Unit]], cal: SimInputs) -> float:
    """Simulated iteration time of ``orders`` with the calibrated unit, transfer and tail times."""
    return predicted_timeline(orders, cal).iteration_time


def measured_timeline(
    orders: Sequence[Sequence[Unit]],
    stages: Sequence[StageTiming],
    cal: SimInputs,
    unit_energy_j: np.ndarray | None = None,
    idle_power_w: float = 0.0,
) -> Timeline:
    """One measured iteration as a Timeline (seconds from the pipeline's start, DAG unit order)."""
    dag = PipelineDag.from_orders(orders, len(orders[0]) // 2)
    m = _Measured(dag, stages)
    gap = np.asarray(cal.gap_s)[dag.stage]
    origin = m.origin(cal.gap_s[0])
    start, end = m.start - gap - origin, m.end - origin
    ready_same = m.free(gap) - origin
    # EnvPipe's recv time (a CUDA event pair around the recv) is never below the transfer itself
    ready_data = np.where(dag.data_crosses, ready_same + np.maximum(m.stall(gap), cal.transfer_s), 0.0)
    energy = np.zeros(dag.num_units) if unit_energy_j is None else np.asarray(unit_energy_j, float)
    return Timeline(dag, start, end, ready_same, ready_data, energy,
                    Overheads.broadcast(len(orders), idle_power_w, cal.transfer_s, cal.tail_s))

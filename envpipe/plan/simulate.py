"""Discrete-event simulation of one iteration on a PipelineDag, and its energy.

Each unit starts when its stage is free and its input has arrived (upstream end + transfer time).
After its last unit a stage may still have a *tail* of work that is not a pipeline unit: the gradient
all-reduce across data-parallel replicas and the optimizer step. The iteration ends when every stage
has finished its tail.

Energy charges every phase at its own power, per stage (`Overheads`): the units at their profiled energy;
the time a stage waits (bubbles, blocking receives: the iteration time less its busy time and its tail) at
its blocking power; its tail at its tail power (default: the blocking power, so the tail counts like a
bubble). E = sum_u e_u + sum_s blocking_s * (idle_s - tail_s) + sum_s tail_power_s * tail_s, where idle_s
is the iteration time less the stage's busy time (docs/planner.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from envpipe.plan.dag import PipelineDag

PerStage = float | Sequence[float] | np.ndarray  # one number for every stage, or one per stage


@dataclass(frozen=True, eq=False)
class Overheads:
    """What an iteration costs besides its units, per pipeline stage: the transfer of an activation or a
    gradient between stages (one for all), the tail after the stage's last unit, the power the stage draws
    while it waits (blocking power) and while it runs its tail."""

    transfer_s: float
    tail_s: np.ndarray  # (S,) seconds
    blocking_power_w: np.ndarray  # (S,) watts
    tail_power_w: np.ndarray  # (S,) watts

    @classmethod
    def broadcast(cls, num_stages: int, blocking_power_w: PerStage, transfer_s: float = 0.0, tail_s: PerStage = 0.0,
                  tail_power_w: PerStage | None = None) -> Overheads:
        """From one number for every stage or one per stage (tail power by default: the blocking power);
        one clear ValueError for a wrong count, a negative or a non-finite number."""
        if not (np.isfinite(transfer_s) and transfer_s >= 0):
            raise ValueError("transfer time must be finite and not negative")
        blocking = per_stage(blocking_power_w, num_stages, "blocking powers")
        return cls(float(transfer_s), per_stage(tail_s, num_stages, "tail times"), blocking,
                   blocking if tail_power_w is None else per_stage(tail_power_w, num_stages, "tail powers"))

    @property
    def num_stages(self) -> int:
        return int(self.tail_s.size)


def per_stage(value: PerStage, num_stages: int, what: str) -> np.ndarray:
    """(S,) values from one number or a per-stage sequence; clear errors otherwise."""
    values = np.asarray(value, float)
    if values.ndim == 0:
        values = np.full(num_stages, float(values))
    if values.shape != (num_stages,):
        raise ValueError(f"{values.size} {what} given for {num_stages} stages")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError(f"{what} must be finite and not negative")
    return values


def weighted_total(values: np.ndarray, weights: np.ndarray) -> float:
    """sum_s values_s * weights_s; with equal weights computed as weight * sum(values), the order of operations
    of one power for every stage, so that such a case gives the same numbers to the last bit."""
    if np.all(weights == weights[0]):
        return float(values.sum() * weights[0])
    return float(values @ weights)


@dataclass(frozen=True)
class Timeline:
    dag: PipelineDag
    start: np.ndarray  # (N,) seconds
    end: np.ndarray
    ready_same: np.ndarray  # when the stage became free for the unit
    ready_data: np.ndarray  # when the unit's input arrived (0 if it has none)
    unit_energy: np.ndarray  # (N,) joules
    overheads: Overheads

    @property
    def tail_s(self) -> np.ndarray:
        """(S,) seconds each stage works after its last unit (all-reduce, optimizer)."""
        return self.overheads.tail_s

    @property
    def stage_end(self) -> np.ndarray:
        """(S,) when each stage finishes its last unit (units are numbered stage-major)."""
        return self.end.reshape(self.dag.num_stages, -1).max(axis=1)

    @property
    def iteration_time(self) -> float:
        return float((self.stage_end + self.tail_s).max())

    @property
    def busy_time(self) -> np.ndarray:
        """(S,) seconds each stage spends computing."""
        return np.bincount(self.dag.stage, weights=self.end - self.start, minlength=self.dag.num_stages)

    @property
    def idle_time(self) -> np.ndarray:
        """(S,) seconds each stage does not run a unit: its waits and its tail."""
        return self.iteration_time - self.busy_time

    @property
    def wait(self) -> np.ndarray:
        """(N,) seconds the stage sat idle right before each unit."""
        return self.start - self.ready_same

    @property
    def dependency_wait(self) -> np.ndarray:
        """(N,) stall caused by waiting for the input (EnvPipe's recv time; 0 without a recv)."""
        return np.maximum(self.ready_data - self.ready_same, 0.0) * self.dag.data_crosses

    @property
    def stage_energy(self) -> np.ndarray:
        """(S,) joules of each stage: its units, its waits at its blocking power, its tail at its tail power."""
        o = self.overheads
        units = np.bincount(self.dag.stage, weights=self.unit_energy, minlength=self.dag.num_stages)
        # written as idle x blocking + tail x (tail - blocking power): the same sum, and with equal powers the
        # last term is exactly 0, so the numbers of a tail charged at blocking power stay bit for bit
        return units + self.idle_time * o.blocking_power_w + o.tail_s * (o.tail_power_w - o.blocking_power_w)

    @property
    def energy(self) -> float:
        """Joules of the iteration, all stages (the sum of ``stage_energy``)."""
        o = self.overheads
        return float(self.unit_energy.sum() + weighted_total(self.idle_time, o.blocking_power_w)
                     + weighted_total(o.tail_s, o.tail_power_w - o.blocking_power_w))

    def critical_path(self) -> list[int]:
        """Unit indices on a longest path, in time order (ties go to the same-stage predecessor)."""
        dag = self.dag
        N = dag.num_units
        last_stage = int(np.argmax(self.stage_end + self.tail_s))  # the stage that ends the iteration
        i = dag.order[last_stage][-1]
        eps = 1e-12 * max(1.0, self.iteration_time)
        _, _, pred_same, pred_data = dag.as_lists
        start, ready_same = self.start.tolist(), self.ready_same.tolist()
        path = [i]
        while start[i] > eps:
            same, data = pred_same[i], pred_data[i]
            if same != N and ready_same[i] >= start[i] - eps:
                i = same
            elif data != N:
                i = data
            else:  # pragma: no cover - a unit that starts late has a binding predecessor
                break
            path.append(i)
        return path[::-1]


def simulate(dag: PipelineDag, duration: np.ndarray, energy: np.ndarray, overheads: Overheads) -> Timeline:
    """Simulate with per-unit ``duration`` (s) and ``energy`` (J), indexed like the DAG's units."""
    if overheads.num_stages != dag.num_stages:
        raise ValueError(f"overheads are given for {overheads.num_stages} stages, the pipeline has {dag.num_stages}")
    end = np.zeros(dag.num_units + 1)  # index N is the "no predecessor" sentinel, ending at 0
    _unit_ends(dag, np.asarray(duration, float), overheads.transfer_s, end, 0)
    return _timeline(dag, end, np.asarray(energy, float), overheads)


def resimulate(previous: Timeline, duration: np.ndarray, energy: np.ndarray, changed: np.ndarray) -> Timeline:
    """``previous`` with new unit ``duration`` and ``energy``, where only the units ``changed`` take another
    time: only the levels from the earliest changed unit on are recomputed, so planning loops that change a
    few late units pay for those levels only."""
    energy = np.asarray(energy, float)
    if changed.size == 0:
        return Timeline(previous.dag, previous.start, previous.end, previous.ready_same, previous.ready_data, energy,
                        previous.overheads)
    dag, overheads = previous.dag, previous.overheads
    end = np.r_[previous.end, 0.0]
    _unit_ends(dag, np.asarray(duration, float), overheads.transfer_s, end, int(dag.depth[changed].min()))
    return _timeline(dag, end, energy, overheads)


def _unit_ends(dag: PipelineDag, duration: np.ndarray, transfer_s: float, end: np.ndarray, first_level: int) -> None:
    """Fill ``end`` (N + 1 entries, ends before ``first_level`` known) level by level from ``first_level`` on."""
    for level, ps, pd, crosses in dag.level_edges[first_level:]:
        ready = end[pd]
        if transfer_s:
            ready = ready + crosses * transfer_s
        end[level] = np.maximum(end[ps], ready) + duration[level]


def _timeline(dag: PipelineDag, end: np.ndarray, energy: np.ndarray, overheads: Overheads) -> Timeline:
    """With every end known, the ready times of all units follow in one vectorised step."""
    ready_same = end[dag.pred_same]
    ready_data = end[dag.pred_data] + dag.data_crosses * overheads.transfer_s
    start = np.maximum(ready_same, ready_data)
    return Timeline(dag, start, end[:dag.num_units], ready_same, ready_data, energy, overheads)

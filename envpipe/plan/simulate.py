"""Discrete-event simulation of one iteration on a PipelineDag.

Each unit starts when its stage is free and its input has arrived (upstream end + transfer time).
After its last unit a stage may still have a *tail* of work that is not a pipeline unit: the gradient
all-reduce across data-parallel replicas and the optimizer step. The iteration ends when every stage
has finished its tail. Energy = unit energies + each stage's idle time (iteration time minus its busy
time) at the blocking (idle) power, the accounting of DESIGN.md and Perseus; a tail is charged at idle
power like a bubble (its work is the same for every plan of a job, so it moves energy by a constant).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.plan.dag import PipelineDag


@dataclass(frozen=True)
class Timeline:
    dag: PipelineDag
    start: np.ndarray  # (N,) seconds
    end: np.ndarray
    ready_same: np.ndarray  # when the stage became free for the unit
    ready_data: np.ndarray  # when the unit's input arrived (0 if it has none)
    unit_energy: np.ndarray  # (N,) joules
    idle_power_w: float
    tail_s: np.ndarray  # (S,) seconds each stage works after its last unit (all-reduce, optimizer)

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
    def energy(self) -> float:
        return float(self.unit_energy.sum() + self.idle_time.sum() * self.idle_power_w)

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


def simulate(
    dag: PipelineDag,
    duration: np.ndarray,
    energy: np.ndarray,
    idle_power_w: float,
    transfer_s: float = 0.0,
    *,
    tail_s: float | np.ndarray = 0.0,
    previous: Timeline | None = None,
    changed: np.ndarray | None = None,
) -> Timeline:
    """Simulate with per-unit ``duration`` (s) and ``energy`` (J), indexed like the DAG's units.

    ``tail_s`` is each stage's work after its last unit (one number for every stage, or one per stage).

    With ``previous`` (a timeline of the same DAG and transfer time) and ``changed`` (the units whose
    duration differs from it), only the levels from the earliest changed unit on are recomputed:
    planning loops that change a few late units pay for those levels only.
    """
    if transfer_s < 0:
        raise ValueError("transfer time must not be negative")
    tail = stage_tails(tail_s, dag.num_stages)
    N = dag.num_units
    end = np.zeros(N + 1)  # index N is the "no predecessor" sentinel, ending at 0
    first_level = 0
    if previous is not None and changed is not None:
        if changed.size == 0:
            return Timeline(dag, previous.start, previous.end, previous.ready_same, previous.ready_data,
                            np.asarray(energy, float), float(idle_power_w), tail)
        end[:N] = previous.end
        first_level = int(dag.depth[changed].min())
    duration = np.asarray(duration, float)
    for level, ps, pd, crosses in dag.level_edges[first_level:]:
        ready = end[pd]
        if transfer_s:
            ready = ready + crosses * transfer_s
        end[level] = np.maximum(end[ps], ready) + duration[level]
    # with every end known, the ready times of all units follow in one vectorised step
    ready_same = end[dag.pred_same]
    ready_data = end[dag.pred_data] + dag.data_crosses * transfer_s
    start = np.maximum(ready_same, ready_data)
    return Timeline(dag, start, end[:N], ready_same, ready_data, np.asarray(energy, float), float(idle_power_w), tail)


def stage_tails(tail_s: float | np.ndarray | list[float], num_stages: int) -> np.ndarray:
    """(S,) per-stage tail times from one number or a per-stage sequence; clear errors otherwise."""
    tail = np.broadcast_to(np.asarray(tail_s, float), (num_stages,)).copy() if np.ndim(tail_s) == 0 \
        else np.asarray(tail_s, float)
    if tail.shape != (num_stages,):
        raise ValueError(f"{tail.size} tail times given for {num_stages} stages")
    if not np.all(np.isfinite(tail)) or np.any(tail < 0):
        raise ValueError("tail times must be finite and not negative")
    return tail

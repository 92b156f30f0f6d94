"""The dependency DAG of one training iteration, built from per-stage unit orders.

Edges: same-stage order; F(s,m) after F(s-1,m) (activation); B(s,m) after B(s+1,m) (gradient);
on the last stage B(m) after F(m). The DAG is independent of unit durations, so it is built once
and then simulated many times (planning loops) with numpy, one topological level at a time.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from envpipe.plan.schedules import Unit


class ScheduleError(ValueError):
    """A schedule is not a valid order of the iteration's units."""


class DeadlockError(ScheduleError):
    """The schedule's order and the data dependencies form a cycle: it would hang."""


@dataclass(frozen=True)
class PipelineDag:
    num_stages: int
    num_microbatches: int
    stage: np.ndarray  # (N,) stage of unit i
    is_fwd: np.ndarray  # (N,) bool
    mb: np.ndarray  # (N,)
    pred_same: np.ndarray  # (N,) previous unit on the same stage, or N (sentinel) for none
    pred_data: np.ndarray  # (N,) the unit whose output this one needs, or N
    data_crosses: np.ndarray  # (N,) bool: pred_data is on another stage (pays a transfer)
    levels: tuple[np.ndarray, ...]  # unit indices grouped by topological depth
    level_edges: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]  # per level: units, preds, crosses
    topo: np.ndarray  # (N,) a topological order
    depth: np.ndarray  # (N,) topological level of each unit
    order: tuple[tuple[int, ...], ...]  # per stage: unit indices in execution order

    @property
    def num_units(self) -> int:
        return int(self.stage.size)

    def index(self, stage: int, kind: str, mb: int) -> int:
        """Index of a unit: units are numbered stage-major, F0..F(M-1) then B0..B(M-1)."""
        return stage * 2 * self.num_microbatches + (0 if kind == "F" else self.num_microbatches) + mb

    @cached_property
    def as_lists(self) -> tuple[list[int], list[bool], list[int], list[int]]:
        """stage, is_fwd, pred_same, pred_data as plain lists, for per-unit Python walks."""
        return self.stage.tolist(), self.is_fwd.tolist(), self.pred_same.tolist(), self.pred_data.tolist()

    def unit(self, i: int) -> tuple[int, str, int]:
        return int(self.stage[i]), "F" if self.is_fwd[i] else "B", int(self.mb[i])

    def scatter(self, per_stage: Sequence[Sequence[float]], dtype: type = np.int64) -> np.ndarray:
        """Per-stage values in execution order (e.g. a plan's clocks) -> one value per DAG unit."""
        out: np.ndarray = np.zeros(self.num_units, dtype)
        for ids, values in zip(self.order, per_stage, strict=True):
            out[list(ids)] = values
        return out

    def per_stage(self, values: np.ndarray) -> list[list[int]]:
        """One integer per DAG unit (e.g. clocks) -> per-stage lists in execution order."""
        return [[int(values[i]) for i in ids] for ids in self.order]

    @classmethod
    def from_orders(cls, orders: Sequence[Sequence[Unit]], num_microbatches: int) -> PipelineDag:
        S, M = len(orders), num_microbatches
        if S < 1 or M < 1:
            raise ScheduleError("a pipeline needs at least 1 stage and 1 micro-batch")
        N = 2 * S * M
        stage = np.repeat(np.arange(S), 2 * M)
        is_fwd = np.tile(np.r_[np.ones(M, bool), np.zeros(M, bool)], S)
        mb = np.tile(np.r_[np.arange(M), np.arange(M)], S)
        idx = lambda s, k, m: s * 2 * M + (0 if k == "F" else M) + m  # noqa: E731

        pred_same = np.full(N, N)
        per_stage: list[tuple[int, ...]] = []
        for s, units in enumerate(orders):
            expected = {("F", m) for m in range(M)} | {("B", m) for m in range(M)}
            seen: set[Unit] = set()
            for u in units:
                if u not in expected:
                    raise ScheduleError(f"stage {s}: unit {u[0]}{u[1]} is not a unit of a {M}-micro-batch iteration")
                if u in seen:
                    raise ScheduleError(f"stage {s}: unit {u[0]}{u[1]} appears twice")
                seen.add(u)
            if seen != expected:
                missing = sorted(expected - seen, key=lambda u: (u[0], u[1]))
                raise ScheduleError(f"stage {s}: missing unit(s) {', '.join(f'{k}{m}' for k, m in missing[:6])}")
            ids = tuple(idx(s, k, m) for k, m in units)
            for a, b in itertools.pairwise(ids):
                pred_same[b] = a
            per_stage.append(ids)

        pred_data = np.full(N, N)
        crosses = np.zeros(N, bool)
        for s in range(S):
            for m in range(M):
                if s > 0:
                    pred_data[idx(s, "F", m)] = idx(s - 1, "F", m)
                    crosses[idx(s, "F", m)] = True
                if s < S - 1:
                    pred_data[idx(s, "B", m)] = idx(s + 1, "B", m)
                    crosses[idx(s, "B", m)] = True
                else:
                    pred_data[idx(s, "B", m)] = idx(s, "F", m)

        topo, depth = _topological(N, pred_same, pred_data, per_stage, S, M)
        order_by_depth = np.argsort(depth, kind="stable")
        bounds = np.flatnonzero(np.diff(depth[order_by_depth])) + 1
        levels = tuple(np.split(order_by_depth, bounds))
        level_edges = tuple((lv, pred_same[lv], pred_data[lv], crosses[lv]) for lv in levels)
        return cls(S, M, stage, is_fwd, mb, pred_same, pred_data, crosses, levels, level_edges, topo, depth,
                   tuple(per_stage))


def _topological(
    N: int, pred_same: np.ndarray, pred_data: np.ndarray, per_stage: list[tuple[int, ...]], S: int, M: int
) -> tuple[np.ndarray, np.ndarray]:
    succ: list[list[int]] = [[] for _ in range(N)]
    indeg = np.zeros(N, int)
    for i in range(N):
        for p in (pred_same[i], pred_data[i]):
            if p != N:
                succ[p].append(i)
                indeg[i] += 1
    depth = np.zeros(N, int)
    queue = deque(int(i) for i in np.flatnonzero(indeg == 0))
    topo = []
    while queue:
        i = queue.popleft()
        topo.append(i)
        for j in succ[i]:
            depth[j] = max(depth[j], depth[i] + 1)
            indeg[j] -= 1
            if indeg[j] == 0:
                queue.append(j)
    if len(topo) < N:
        done = set(topo)
        blocked = []
        for s, ids in enumerate(per_stage):
            first = next((i for i in ids if i not in done), None)
            if first is not None:
                kind = "F" if (first - s * 2 * M) < M else "B"
                blocked.append(f"stage {s} at {kind}{(first - s * 2 * M) % M}")
        raise DeadlockError("schedule deadlocks: every stage waits on another (" + "; ".join(blocked) + ")")
    return np.asarray(topo), depth


def engine_order_dag(orders: Sequence[Sequence[Unit]], num_microbatches: int) -> PipelineDag:
    """The DAG of orders that DeepSpeed's pipeline engine can run; ScheduleError (one line) otherwise.

    Beyond a valid, deadlock-free order (`PipelineDag.from_orders`), the engine needs forwards and
    backwards each in micro-batch order (its p2p receives match in order) and, on the last stage,
    B(m) right after F(m) (its backward uses the latest loss).
    """
    dag = PipelineDag.from_orders(orders, num_microbatches)
    last = len(orders) - 1
    for s, order in enumerate(orders):
        for kind in ("F", "B"):
            if [m for k, m in order if k == kind] != list(range(num_microbatches)):
                raise ScheduleError(
                    f"stage {s}: the engine runs {kind} units in micro-batch order 0..{num_microbatches - 1}"
                )
        if s == last and any(k == "B" and order[i - 1] != ("F", m) for i, (k, m) in enumerate(order)):
            raise ScheduleError(
                "last stage: each B(m) must directly follow F(m) (DeepSpeed's backward uses the latest loss)"
            )
    return dag

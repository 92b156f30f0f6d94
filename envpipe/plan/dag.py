"""The dependency DAG of one training iteration, built from per-stage unit orders.

Edges: same-stage order; F(c,m) after F(c-1,m) (activation); B(c,m) after B(c+1,m) (gradient); on the
last model stage B(m) after F(m), where c counts *model* stages: with one chunk per pipeline stage c is
the stage, with several (interleaved 1F1B, DualPipeV) the layout says which stage runs c
(envpipe.plan.layout), and an edge between two chunks of one stage pays no transfer. The DAG is
independent of unit durations, so it is built once and then simulated many times (planning loops) with
numpy, one topological level at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from envpipe.plan.layout import StageLayout
from envpipe.plan.schedules import ChunkUnit, Unit


class ScheduleError(ValueError):
    """A schedule is not a valid order of the iteration's units."""


class DeadlockError(ScheduleError):
    """The schedule's order and the data dependencies form a cycle: it would hang."""


@dataclass(frozen=True)
class PipelineDag:
    num_stages: int  # pipeline stages (GPUs)
    num_microbatches: int
    stage: np.ndarray  # (N,) pipeline stage of unit i
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
    chunk: np.ndarray  # (N,) which of its stage's chunks the unit runs (0 with one chunk per stage)
    model_stage: np.ndarray  # (N,) the model stage (row of the model profile) the unit runs
    num_chunks: int = 1

    @property
    def num_units(self) -> int:
        return int(self.stage.size)

    def index(self, stage: int, kind: str, mb: int, chunk: int = 0) -> int:
        """Index of a unit: units are numbered stage-major, then by chunk, F0..F(M-1) then B0..B(M-1)."""
        M = self.num_microbatches
        return (stage * self.num_chunks + chunk) * 2 * M + (0 if kind == "F" else M) + mb

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
    def label(self, i: int) -> str:
        """``F3`` (one chunk per stage) or ``F3.1`` (micro-batch 3 on chunk 1)."""
        name = f"{'F' if self.is_fwd[i] else 'B'}{self.mb[i]}"
        return name if self.num_chunks == 1 else f"{name}.{self.chunk[i]}"

    @classmethod
    def from_orders(cls, orders: Sequence[Sequence[Unit]] | Sequence[Sequence[ChunkUnit]], num_microbatches: int,
                    layout: StageLayout | None = None) -> PipelineDag:
        """The DAG of per-stage orders of ``(kind, mb)`` units, or of ``(kind, mb, chunk)`` units on a layout
        with several chunks per stage (default: one model stage per pipeline stage)."""
        S, M = len(orders), num_microbatches
        if S < 1 or M < 1:
            raise ScheduleError("a pipeline needs at least 1 stage and 1 micro-batch")
        layout = StageLayout.single(S) if layout is None else layout
        if layout.num_stages != S:
            raise ScheduleError(f"{S} stage orders for a layout of {layout.num_stages} stages")
        v = layout.chunks
        N = 2 * S * M * v
        stage = np.repeat(np.arange(S), 2 * M * v)
        chunk = np.tile(np.repeat(np.arange(v), 2 * M), S)
        is_fwd = np.tile(np.r_[np.ones(M, bool), np.zeros(M, bool)], S * v)
        mb = np.tile(np.r_[np.arange(M), np.arange(M)], S * v)
        model_stage = np.asarray(layout.model_stage)[stage, chunk]
        idx = lambda s, k, m, c: (s * v + c) * 2 * M + (0 if k == "F" else M) + m  # noqa: E731

        expected = {(k, m, c) for k in "FB" for m in range(M) for c in range(v)}
        pred_same = np.full(N, N)
        per_stage: list[tuple[int, ...]] = []
        for s, units in enumerate(orders):
            seen: set[tuple[str, int, int]] = set()
            for u in units:
                key = (u[0], u[1], u[2] if len(u) == 3 else 0)
                name = f"{key[0]}{key[1]}" + (f" of chunk {key[2]}" if v > 1 else "")
                if key not in expected or (len(u) == 3) != (v > 1):
                    raise ScheduleError(f"stage {s}: unit {name} is not a unit of a {M}-micro-batch iteration"
                                        + (f" with {v} chunks per stage" if v > 1 else ""))
                if key in seen:
                    raise ScheduleError(f"stage {s}: unit {name} appears twice")
                seen.add(key)
            if seen != expected:
                missing = sorted(expected - seen)
                raise ScheduleError(f"stage {s}: missing unit(s) "
                                    + ", ".join(f"{k}{m}" + (f".{c}" if v > 1 else "") for k, m, c in missing[:6]))
            ids = tuple(idx(s, u[0], u[1], u[2] if len(u) == 3 else 0) for u in units)
            for a, b in itertools.pairwise(ids):
                pred_same[b] = a
            per_stage.append(ids)

        # data edges between consecutive model stages (vectorised over micro-batches)
        owner_stage, owner_chunk = layout.owner()
        first = (owner_stage * v + owner_chunk) * 2 * M  # index of F0 of each model stage
        C, ms = layout.num_model_stages, np.arange(M)
        pred_data = np.full(N, N)
        crosses = np.zeros(N, bool)
        for c in range(C):
            if c > 0:
                pred_data[first[c] + ms] = first[c - 1] + ms
                crosses[first[c] + ms] = owner_stage[c] != owner_stage[c - 1]
            if c < C - 1:
                pred_data[first[c] + M + ms] = first[c + 1] + M + ms
                crosses[first[c] + M + ms] = owner_stage[c] != owner_stage[c + 1]
            else:
                pred_data[first[c] + M + ms] = first[c] + ms

        topo, depth = _topological(N, pred_same, pred_data, per_stage, lambda i: cls._name(i, M, v))
        bounds = np.flatnonzero(np.diff(depth[topo])) + 1
        levels = tuple(np.split(topo, bounds))
        level_edges = tuple((lv, pred_same[lv], pred_data[lv], crosses[lv]) for lv in levels)
        return cls(S, M, stage, is_fwd, mb, pred_same, pred_data, crosses, levels, level_edges, topo, depth,
                   tuple(per_stage), chunk, model_stage, v)

    @staticmethod
    def _name(i: int, M: int, v: int) -> str:
        rest = i % (2 * M)
        name = f"{'F' if rest < M else 'B'}{rest % M}"
        return name if v == 1 else f"{name}.{(i // (2 * M)) % v}"


def _topological(
    N: int, pred_same: np.ndarray, pred_data: np.ndarray, per_stage: list[tuple[int, ...]],
    name: Callable[[int], str],
) -> tuple[np.ndarray, np.ndarray]:
    """A topological order (by level) and each unit's level: the longest path to it from a unit without
    predecessors. Levels are found all at once, one after another: a unit's level is the round in which its last
    predecessor was placed, plus one. Each unit leads to at most one unit on its stage and one by data."""
    has_same, has_data = pred_same != N, pred_data != N
    waiting = has_same.astype(int) + has_data
    succ = np.full((N + 1, 2), N)  # row N takes the sentinel's writes
    succ[pred_same, 0] = np.arange(N)
    succ[pred_data, 1] = np.arange(N)
    depth = np.full(N, -1)
    level, frontier = 0, np.flatnonzero(waiting == 0)
    while frontier.size:
        depth[frontier] = level
        after = succ[frontier].ravel()
        after = after[after != N]
        np.subtract.at(waiting, after, 1)
        frontier = np.unique(after[waiting[after] == 0])
        level += 1
    if np.any(depth < 0):
        blocked = []
        for s, ids in enumerate(per_stage):
            first = next((i for i in ids if depth[i] < 0), None)
            if first is not None:
                blocked.append(f"stage {s} at {name(first)}")
        raise DeadlockError("schedule deadlocks: every stage waits on another (" + "; ".join(blocked) + ")")
    return np.argsort(depth, kind="stable"), depth


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

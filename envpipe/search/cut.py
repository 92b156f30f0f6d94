"""Cutting L layers into S contiguous pipeline stages: the bottleneck (min-max) partition, by dynamic programming.

``cost[s, a, b]`` is what stage s costs when it holds layers a..b-1 (inf where that is not allowed, e.g.
it does not fit in memory). The best cut minimises the largest stage cost:

    best[0, b] = cost[0, 0, b]
    best[s, b] = min over a < b of max(best[s-1, a], cost[s, a, b])

and the answer is best[S-1, L], O(S L^2) with one vectorised step per stage. Stage costs may depend on
the stage (a stage early in a 1F1B pipeline holds more micro-batches in flight), which is why the table
is per stage. DeepSpeed's `partition_balanced` solves the same problem for one weight per layer and no
constraint; this one also carries feasibility. Used twice by the search: time-balanced among the cuts
that fit (cost = unit time, inf where the stage does not fit) and, to explain a search that found
nothing, least memory (cost = the stage's peak bytes).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Cut:
    counts: tuple[int, ...]  # layers per stage
    cost: float  # the largest stage cost

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """(first layer, end) of every stage."""
        ends = np.cumsum(self.counts)
        return [(int(e - c), int(e)) for c, e in zip(self.counts, ends, strict=True)]


def segment_sums(values: np.ndarray) -> np.ndarray:
    """(L+1, L+1) table: [a, b] = values[a:b].sum() for a < b, inf elsewhere (empty or reversed stages)."""
    prefix = np.r_[0.0, np.cumsum(values, dtype=float)]
    table = prefix[None, :] - prefix[:, None]
    return np.where(np.triu(np.ones_like(table, dtype=bool), k=1), table, np.inf)


def segment_max(values: np.ndarray) -> np.ndarray:
    """(L+1, L+1) table: [a, b] = values[a:b].max() for a < b, -inf elsewhere."""
    n = values.size
    table = np.full((n + 1, n + 1), -np.inf)
    for a in range(n):
        table[a, a + 1:] = np.maximum.accumulate(values[a:].astype(float))
    return table


def bottleneck_cut(cost: np.ndarray) -> Cut | None:
    """The cut of the L layers into S stages with the smallest largest stage cost; None if every cut has a
    stage of infinite cost. ``cost`` has shape (S, L+1, L+1)."""
    S, n1, _ = cost.shape
    L = n1 - 1
    if S > L:
        return None
    best = cost[0, 0].copy()  # best[b]: stages 0..s cover layers 0..b-1
    choice = np.zeros((S, n1), dtype=int)
    for s in range(1, S):
        options = np.maximum(best[:, None], cost[s])  # [a, b]
        choice[s] = np.argmin(options, axis=0)
        best = options[choice[s], np.arange(n1)]
    if not np.isfinite(best[L]):
        return None
    ends = [L]
    for s in range(S - 1, 0, -1):
        ends.append(int(choice[s, ends[-1]]))
    ends.append(0)
    bounds = ends[::-1]
    return Cut(tuple(b - a for a, b in itertools.pairwise(bounds)), float(best[L]))

"""The DP stage cut against brute force over every cut of small cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from envpipe.search.cut import bottleneck_cut, segment_max, segment_sums


def all_cuts(layers: int, stages: int):
    """Every composition of ``layers`` into ``stages`` positive counts."""
    for bars in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *bars, layers)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


def brute_force(cost: np.ndarray) -> float:
    S, n1, _ = cost.shape
    best = np.inf
    for counts in all_cuts(n1 - 1, S):
        bounds = np.r_[0, np.cumsum(counts)]
        best = min(best, max(cost[s, bounds[s], bounds[s + 1]] for s in range(S)))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_dp_cut_is_optimal_against_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 9))
    S = int(rng.integers(1, L + 1))
    times = rng.uniform(0.1, 3.0, L)
    sums = segment_sums(times)
    # stage-dependent feasibility, as memory with more micro-batches in flight early in the pipeline
    memory = segment_sums(rng.uniform(1.0, 2.0, L))
    limit = rng.uniform(1.5, 8.0)
    cost = np.stack([np.where(memory * (S - s) <= limit * S, sums, np.inf) for s in range(S)])
    expected = brute_force(cost)
    cut = bottleneck_cut(cost)
    if not np.isfinite(expected):
        assert cut is None
        return
    assert cut is not None
    assert cut.cost == pytest.approx(expected)
    assert sum(cut.counts) == L and len(cut.counts) == S and min(cut.counts) >= 1
    bounds = cut.bounds
    assert max(cost[s, a, b] for s, (a, b) in enumerate(bounds)) == pytest.approx(cut.cost)


def test_more_stages_than_layers_has_no_cut() -> None:
    assert bottleneck_cut(np.stack([segment_sums(np.ones(3))] * 4)) is None


def test_segment_tables() -> None:
    v = np.array([3.0, 1.0, 2.0])
    sums, maxima = segment_sums(v), segment_max(v)
    assert sums[0, 3] == 6 and sums[1, 3] == 3 and np.isinf(sums[2, 2]) and np.isinf(sums[2, 1])
    assert maxima[0, 3] == 3 and maxima[1, 3] == 2 and maxima[1, 2] == 1 and maxima[2, 2] == -np.inf

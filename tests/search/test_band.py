"""The host band (envpipe.search.band): how far a configuration's predicted time moves with the host's speed, its
regime, and the ranks the host's speed could swap; worked out on profiles whose host and device times are chosen."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envpipe.search.band import HostBand, host_band, undecided
from envpipe.search.cut import Cut
from envpipe.search.engine_model import SIMULATED_GPU
from envpipe.search.evaluate import build_pipeline, plan_pipeline
from envpipe.search.inputs import SearchInputs
from envpipe.search.memory import MemoryTables
from envpipe.search.search import Objective, SearchOptions, search
from envpipe.search.space import Shape
from tests.support.layer_profiles import cluster, layer_profile


def _band(host_ms: float, spread: float, b: int = 1) -> tuple[HostBand, float]:
    """One stage of four layers of 2 ms device time (at b = 1), each taking the host ``host_ms``."""
    layers = layer_profile([2.0] * 4, host_ms=[host_ms] * 4)
    inputs = SearchInputs(layers, cluster(1, 1), replace(SIMULATED_GPU, host_spread=spread))
    shape = Shape(1, 1, b, 8)
    pipeline = build_pipeline(inputs, shape, Cut((4,), 0.0), MemoryTables(layers, b, 1, 8))
    candidate = plan_pipeline(pipeline, inputs.cluster.usable_bytes)
    return host_band(inputs, candidate), candidate.iteration_time_s


def test_a_launch_bound_stage_moves_with_the_host_and_a_device_bound_one_does_not() -> None:
    """Host 6 ms a layer against 2 ms on the device: the host sets every unit's time (8 micro-batches of 4 layers,
    forward 2 ms and backward 4 ms each: 192 ms), not the optimizer steps' 4 ms tail: its share is 192 / 196, the
    band that share of the spread. Host 0.2 ms: the device sets it, the band is a point."""
    band, time = _band(6.0, 0.1)
    share = 192 / 196
    assert time == pytest.approx(0.196) and band.regime == "launch-bound"
    assert band.host_share == pytest.approx(share)
    assert band.time_s == pytest.approx((time * (1 - 0.1 * share), time * (1 + 0.1 * share)))
    assert band.energy_j[0] < band.energy_j[1]
    band, time = _band(0.2, 0.1)
    assert band.regime == "device-bound" and band.host_share == pytest.approx(0.0, abs=1e-9)
    assert band.time_s == pytest.approx((time, time))


def test_without_a_spread_the_band_is_a_point_and_the_regime_still_said() -> None:
    band, time = _band(6.0, 0.0)
    assert band.time_s == (time, time) and band.regime == "launch-bound"
    assert band.to_json()["regime"] == "launch-bound" and band.to_json()["time_band_s"] == [time, time]


def test_mixed_between_the_two() -> None:
    """Host about as slow as the device: part of the time is the host's."""
    band, _ = _band(2.0, 0.2)
    assert band.regime == "mixed" and 0.1 <= band.host_share < 0.5


@given(st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(0.0, 0.5)), min_size=1, max_size=6),
       st.booleans())
@settings(max_examples=200, deadline=None)
def test_undecided_are_the_ranks_whose_band_meets_the_firsts(bands: list[tuple[float, float]], by_energy: bool) -> None:
    made = [HostBand((t * (1 - w), t * (1 + w)), (2 * t * (1 - w), 2 * t * (1 + w)), 0.5) for t, w in bands]
    ranks = undecided(made, by_energy)
    first = made[0].energy_j if by_energy else made[0].time_s
    for rank, band in enumerate(made[1:], 2):
        low, high = band.energy_j if by_energy else band.time_s
        assert (rank in ranks) == (not (high < first[0] or low > first[1]))
    assert undecided([], by_energy) == []


def test_the_search_reports_bands_and_undecided_ranks() -> None:
    """Launch-bound at both micro-batch sizes (host 20 ms a layer at b = 1 and 38 ms at b = 2, device 0.1 ms times
    b^0.8): b = 2 is predicted 5 % faster, well within a 10 % spread, so the host's speed could put b = 1 first;
    with a 1 % spread it could not."""
    base = layer_profile([0.1] * 4, host_ms=[20.0] * 4, sizes=(1, 2))
    layers = replace(base, layers=tuple(
        replace(layer, per_micro_batch={**layer.per_micro_batch, 2: replace(
            layer.per_micro_batch[2], forward_host_s=1.9 * layer.per_micro_batch[1].forward_host_s,
            backward_host_s=1.9 * layer.per_micro_batch[1].backward_host_s)}) for layer in base.layers))
    for spread, expected in ((0.1, [2]), (0.01, [])):
        inputs = SearchInputs(layers, cluster(1, 1), replace(SIMULATED_GPU, host_spread=spread))
        result = search(inputs, 8, Objective("throughput"), SearchOptions(top_k=2))
        assert [c.shape.micro_batch for c in result.candidates] == [2, 1]
        assert [band.regime for band in result.bands] == ["launch-bound"] * 2
        assert result.undecided == expected

"""The stage time model with worked numbers: the host and the device issuing layers one after the other,
launch-bound and device-bound stages, the engine's fixed host work per forward unit, the host scale, the
repeat times' lost overlap, the unit calls the engine pays once per micro-batch, the micro-batch's load,
and the iteration of a one-stage pipeline that adds them up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from envpipe.search.cluster import Cluster
from envpipe.search.cut import Cut
from envpipe.search.engine_model import SIMULATED_GPU
from envpipe.search.evaluate import build_pipeline
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import LayerCost, UnitCalls
from envpipe.search.memory import MemoryTables
from envpipe.search.space import Shape
from envpipe.search.timing import issue, layer_weight, unit_times
from tests.support.layer_profiles import layer_profile

MS = 1e-3


def cost(forward_device: float, forward_host: float, backward_device: float, backward_host: float,
         forward_repeat: float = 0.0, backward_repeat: float = 0.0) -> LayerCost:
    """A layer's costs in milliseconds (memory irrelevant here)."""
    return LayerCost(forward_device * MS, backward_device * MS, 0, 0, 0, 0, forward_host * MS, backward_host * MS,
                     forward_repeat * MS, backward_repeat * MS)


def test_issue_by_hand() -> None:
    # layer 1: host 0-1, device 0-0.5 but cannot end before its last kernel is issued: 1
    # layer 2: host 1-2, device from max(1, 1) for 3: 4
    assert issue([1.0, 1.0], [0.5, 3.0]) == (2.0, 4.0)
    # a device busy until 10 delays everything behind it
    assert issue([1.0], [2.0], host_t=0.0, device_t=10.0) == (1.0, 12.0)


def test_launch_bound_stage_takes_the_hosts_time() -> None:
    """Three layers the host needs 2 ms each to issue and the device 0.5 ms to run: 6 ms forward."""
    forward, _ = unit_times([cost(0.5, 2.0, 1.0, 3.0)] * 3, SIMULATED_GPU)
    assert forward == pytest.approx(6 * MS)


def test_device_bound_stage_takes_the_devices_time() -> None:
    """The host issues in 0.5 ms what the device runs in 2 ms: the device starts with the first kernel and
    never waits, 3 x 2 ms."""
    forward, backward = unit_times([cost(2.0, 0.5, 4.0, 1.0)] * 3, SIMULATED_GPU)
    assert forward == pytest.approx(6 * MS)
    # the backward's host work started right after the forward's (1.5 ms), its device work waits for the
    # forward's end (6 ms): 3 x 4 ms after it
    assert backward == pytest.approx(12 * MS)


def test_mixed_stage_is_not_a_sum_of_per_layer_maxima() -> None:
    """A launch-bound block (host 2 ms, device 0.2) and a device-bound head (host 0.1, device 3): the sum of
    per-layer maxima, 5 ms, holds in one order and is 1.8 ms long in the other."""
    block, head = cost(0.2, 2.0, 0.4, 4.0), cost(3.0, 0.1, 6.0, 0.2)
    forward, _ = unit_times([block, head], SIMULATED_GPU)
    assert forward == pytest.approx(5.0 * MS)  # block issued by 2.0 (device done at 2.0), head runs 2.0-5.0
    forward, _ = unit_times([head, block], SIMULATED_GPU)
    # head issued 0-0.1, runs 0-3; block issued 0.1-2.1, its 0.2 ms after the head: 3.2
    assert forward == pytest.approx(3.2 * MS)


def test_the_engines_fixed_host_work_per_forward_unit() -> None:
    """Every forward starts on an idle device after the engine's own host work: it shifts the whole unit."""
    layers = [cost(0.5, 2.0, 1.0, 3.0)] * 3
    engine = replace(SIMULATED_GPU, unit_host_s=0.4 * MS)
    forward, backward = unit_times(layers, engine)
    assert forward == pytest.approx(6.4 * MS) and backward == pytest.approx(9 * MS)


def test_host_scale() -> None:
    """The host's times as the engine's stage loop takes them: a launch-bound stage scales with them."""
    layers = [cost(0.5, 2.0, 1.0, 3.0)] * 3
    forward, backward = unit_times(layers, replace(SIMULATED_GPU, host_scale=0.5))
    assert forward == pytest.approx(3 * MS) and backward == pytest.approx(4.5 * MS)


def test_repeat_time_adds_the_overlap_a_layer_loses() -> None:
    """Host 1 ms, device 1 ms, but back to back 1.5 ms per unit: a stage of four such layers takes 6 ms, not 4."""
    layers = [cost(1.0, 1.0, 2.0, 2.0, forward_repeat=1.5, backward_repeat=2.0)] * 4
    forward, backward = unit_times(layers, SIMULATED_GPU)
    assert forward == pytest.approx(6 * MS) and backward == pytest.approx(8 * MS)
    assert layer_weight(layers[0]) == pytest.approx(3.5 * MS)


def test_one_stage_iteration_adds_units_steps_and_engine_work() -> None:
    """P = 1: M x (forward + backward) + the optimizer steps + the engine's work per iteration; the fixed
    host work per forward unit adds M times itself (exactly: every forward starts on an idle device)."""
    profile = layer_profile([3.0, 3.0, 3.0], host_ms=[6.0, 6.0, 6.0], params=[1_000_000] * 3)
    L, M = profile.num_layers, 4
    cluster = Cluster(1, 1, 1 << 34, 1e11, 1e10, 1e-5, 1e11)

    def iteration(engine) -> float:
        return build_pipeline(SearchInputs.of(profile, cluster, engine), Shape(1, 1, 1, M), Cut((L,), 0.0),
                              MemoryTables(profile, 1, 1, M)).baseline_time_s

    # each layer: device 1 + 2 ms, host 2 + 4 ms (launch-bound): 18 ms per micro-batch; steps 3 x 1 ms
    assert iteration(SIMULATED_GPU) == pytest.approx(M * 18 * MS + 3 * MS)
    engine = replace(SIMULATED_GPU, unit_host_s=0.5 * MS, iteration_s=2 * MS)
    assert iteration(engine) == pytest.approx(M * 18.5 * MS + 3 * MS + 2 * MS)


def test_the_backward_pays_the_unit_calls_once() -> None:
    """Three launch-bound layers (backward host 2.5 ms each, without calls, as profiled inside one backward()):
    the engine's backward issues the stage's calls once (0.5 ms) and then the three layers: 8 ms."""
    layers = [cost(0.5, 2.0, 1.0, 2.5)] * 3
    forward, backward = unit_times(layers, SIMULATED_GPU, stage_calls_s=0.5 * MS)
    assert forward == pytest.approx(6 * MS) and backward == pytest.approx(8 * MS)


def test_unit_calls_hide_behind_a_device_bound_forward() -> None:
    """Device-bound layers (device 4 ms, host 0.6 ms, repeat 3.8 ms): the calls' 0.4 ms of host work overlaps
    the forward's device time and the backward stays 3 x 4 ms, as without calls."""
    layers = [cost(2.0, 0.5, 4.0, 0.6, backward_repeat=3.8)] * 3
    _, without = unit_times(layers, SIMULATED_GPU)
    _, backward = unit_times(layers, SIMULATED_GPU, stage_calls_s=0.4 * MS)
    assert without == backward == pytest.approx(12 * MS)


def test_the_repeat_time_adds_the_overlap_host_and_device_lose() -> None:
    """Host 1.5 ms, device 2 ms, back to back 2.3 ms per backward unit: a layer inside the engine's backward
    loses 2.3 - 2 = 0.3 ms of overlap, 2.3 ms a layer; the calls' 0.5 ms overlaps the forward's device time."""
    layers = [cost(1.0, 0.2, 2.0, 1.5, backward_repeat=2.3)] * 4
    _, backward = unit_times(layers, SIMULATED_GPU, stage_calls_s=0.5 * MS)
    assert backward == pytest.approx(4 * 2.3 * MS)


def test_the_micro_batch_load_delays_the_forward() -> None:
    """The load (0.7 ms) comes before the forward's layers on an idle device, like the engine's own host work,
    and adds to it."""
    layers = [cost(2.0, 0.5, 4.0, 1.0)] * 3
    engine = replace(SIMULATED_GPU, unit_host_s=0.1 * MS)
    forward, backward = unit_times(layers, engine, load_s=0.7 * MS)
    assert forward == pytest.approx(6.8 * MS) and backward == pytest.approx(12 * MS)


def test_layer_weight_is_the_slowest_of_host_device_and_repeat() -> None:
    """The cut's weight of a layer: per unit the slowest of its three times (the backward's repeat here)."""
    layer = cost(1.0, 0.5, 1.0, 3.0, backward_repeat=3.1)
    assert layer_weight(layer) == pytest.approx(4.1 * MS)


def test_a_pipeline_loads_on_its_first_and_last_stage_and_pays_the_calls_per_stage() -> None:
    """Three stages of one launch-bound layer each (host 2 + 4 ms; the unit calls 1 ms): every stage's backward
    issues the calls once and its layer's 4 ms; the first and the last stage load the micro-batch (0.5 ms)
    before their forward, the middle one does not."""
    profile = replace(layer_profile([3.0, 3.0, 3.0], host_ms=[6.0, 6.0, 6.0]),
                      unit_calls=UnitCalls(0.8 * MS, 0.2 * MS, {1: 0.5 * MS, 2: 0.6 * MS, 4: 0.7 * MS}, "test"))
    cluster = Cluster(1, 3, 1 << 34, 1e11, 1e10, 1e-5, 1e11)
    pipeline = build_pipeline(SearchInputs.of(profile, cluster, SIMULATED_GPU), Shape(3, 1, 1, 2), Cut((1, 1, 1), 0.0),
                              MemoryTables(profile, 1, 1, 2))
    forward = pipeline.profile.fwd_time[:, 0]  # at the top clock
    backward = pipeline.profile.bwd_time[:, 0]
    assert forward == pytest.approx([2.5 * MS, 2.0 * MS, 2.5 * MS])
    assert backward == pytest.approx([5.0 * MS] * 3)


def test_graphed_units_take_their_layers_device_times() -> None:
    """Replayed as CUDA graphs, launch-bound layers (host 2 + 4 ms, device 1 + 2 ms) take their device times: the
    forward the load (0.7 ms), the engine's host work (0.1 ms) and 3 x 1 ms; the backward 3 x 2 ms, the repeat
    times' lost overlap gone with the launches."""
    layers = [cost(1.0, 2.0, 2.0, 4.0, forward_repeat=2.5, backward_repeat=4.5)] * 3
    engine = replace(SIMULATED_GPU, unit_host_s=0.1 * MS)
    forward, backward = unit_times(layers, engine, stage_calls_s=0.5 * MS, load_s=0.7 * MS, graphed=True)
    assert forward == pytest.approx(3.8 * MS) and backward == pytest.approx(6 * MS)
    assert layer_weight(layers[0], graphed=True) == pytest.approx(3 * MS)


def test_a_graphed_backward_waits_for_the_host_calls_that_take_longer() -> None:
    """The calls a graphed backward still makes on the host (8 ms at host scale 2) outlast its layers' 6 ms."""
    layers = [cost(1.0, 2.0, 2.0, 4.0)] * 3
    _, backward = unit_times(layers, replace(SIMULATED_GPU, host_scale=2.0), stage_calls_s=4 * MS, graphed=True)
    assert backward == pytest.approx(8 * MS)


def test_a_fitted_step_per_parameter_replaces_the_profiles_step_times() -> None:
    """The engine model's step per parameter (2 ns) times the stage's 3 M parameters: 6 ms for the profile's
    3 x 1 ms (test_one_stage_iteration_adds_units_steps_and_engine_work's pipeline)."""
    profile = layer_profile([3.0, 3.0, 3.0], host_ms=[6.0, 6.0, 6.0], params=[1_000_000] * 3)
    cluster = Cluster(1, 1, 1 << 34, 1e11, 1e10, 1e-5, 1e11)
    engine = replace(SIMULATED_GPU, step_per_parameter_s=2e-9)
    iteration = build_pipeline(SearchInputs.of(profile, cluster, engine), Shape(1, 1, 1, 4), Cut((3,), 0.0),
                               MemoryTables(profile, 1, 1, 4)).baseline_time_s
    assert iteration == pytest.approx(4 * 18 * MS + 6 * MS)

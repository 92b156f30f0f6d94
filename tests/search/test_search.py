"""The search: only configurations that fit in memory, the best cut of each, pruning that loses nothing,
and one clear line when nothing can be returned."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from envpipe.plan.memory import peak_in_flight
from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import one_f_one_b
from envpipe.search.cut import Cut
from envpipe.search.engine_model import SIMULATED_GPU, device_overhead, engine_model
from envpipe.search.evaluate import build_pipeline, plan_pipeline
from envpipe.search.found import found_config
from envpipe.search.inputs import SearchInputs
from envpipe.search.memory import MemoryTables
from envpipe.search.search import Objective, SearchOptions, search
from envpipe.search.space import SearchError, Shape, shapes
from tests.support.layer_profiles import MIB, cluster, layer_profile


def _cuts(layers: int, stages: int):
    for bars in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *bars, layers)
        yield Cut(tuple(b - a for a, b in itertools.pairwise(bounds)), 0.0)


def _fits(tables: MemoryTables, cut: Cut, flight: list[int], allocatable: int) -> bool:
    return all(tables.stage(a, b).peak(w) <= allocatable for (a, b), w in zip(cut.bounds, flight, strict=True))


def _unit_time(profile, b: int, cut: Cut) -> float:
    return max(sum(c.per_micro_batch[b].forward_s + c.per_micro_batch[b].backward_s for c in profile.layers[lo:hi])
               for lo, hi in cut.bounds)


@pytest.mark.parametrize("seed", range(6))
def test_returned_configurations_fit_and_have_the_best_feasible_cut(seed: int) -> None:
    rng = np.random.default_rng(seed)
    L = int(rng.integers(4, 7))
    profile = layer_profile(rng.uniform(1, 5, L).tolist(), rng.uniform(2, 12, L).tolist(),
                            rng.integers(200_000, 3_000_000, L).tolist())
    gpus = 4
    memory_mib = float(rng.uniform(30, 160))
    hw = cluster(1, gpus, memory_mib)
    try:
        result = search(SearchInputs.of(profile, hw), 8, Objective("throughput"), SearchOptions(top_k=100))
    except SearchError as exc:  # then no shape may have a cut that fits
        assert str(exc).startswith("no configuration fits")
        result = None
    returned = {c.shape: c for c in result.candidates} if result else {}
    allocatable = device_overhead(profile, engine_model(profile)).allocatable(hw.usable_bytes)
    for shape in shapes(gpus, L, 8, profile.micro_batch_sizes):
        tables = MemoryTables(profile, shape.micro_batch, shape.replicas, shape.microbatches)
        flight = peak_in_flight(one_f_one_b(shape.stages, shape.microbatches))
        feasible = [c for c in _cuts(L, shape.stages) if _fits(tables, c, flight, allocatable)]
        assert (shape in returned) == bool(feasible), shape
        if feasible:
            got = returned[shape]
            assert min(_unit_time(profile, shape.micro_batch, c) for c in feasible) == pytest.approx(
                _unit_time(profile, shape.micro_batch, got.pipeline.cut))
            assert max(got.peak_bytes) <= hw.usable_bytes  # with the order the planner chose
    if result:
        s = result.stats
        assert s.shapes == s.infeasible + s.pruned + s.too_slow + s.planned


def test_envpipe_order_only_with_memory_for_it() -> None:
    """Extra warm-up forwards keep more activations in flight: a tight memory keeps the planner at 1F1B."""
    profile = layer_profile([2.0, 2.0, 2.0, 6.0], act_mib=[40.0] * 4)
    shape = Shape(2, 1, 1, 8)
    tables = MemoryTables(profile, 1, 1, 8)
    cut = Cut((2, 2), 0.0)
    stage0 = tables.stage(0, 2)
    overhead = device_overhead(profile, engine_model(profile))
    roomy = 1 << 34
    tight = overhead.device_bytes(stage0.peak(2) + stage0.per_microbatch // 2)  # 1F1B's 2 in flight on stage 0, not 3
    for capacity, extra_allowed in ((roomy, True), (tight, False)):
        hw = cluster(1, 2, capacity / MIB)
        candidate = plan_pipeline(build_pipeline(SearchInputs.of(profile, hw), shape, cut, tables), hw.memory_bytes)
        assert (candidate.reschedule[0] > 0) == extra_allowed, candidate.reschedule
        assert max(candidate.peak_bytes) <= capacity


def test_the_order_at_the_top_clock_is_predicted_for_gpus_without_the_clock_daemon() -> None:
    """Where clocks cannot be set the runtime deploys the plan's order at default clocks: the search predicts that
    run too (found configurations carry it as `order_iteration_time_s`)."""
    profile = layer_profile([2.0, 2.0, 2.0, 6.0], act_mib=[40.0] * 4)
    shape, cut = Shape(2, 1, 1, 8), Cut((2, 2), 0.0)
    hw = cluster(1, 2, float(1 << 34) / MIB)
    pipeline = build_pipeline(SearchInputs.of(profile, hw), shape, cut, MemoryTables(profile, 1, 1, 8))
    planned = plan_pipeline(pipeline, hw.memory_bytes)
    assert planned.reschedule[0] > 0  # EnvPipe's order, its units off the critical path at lower clocks
    top = planned.order_time_s
    assert pipeline.time_lower_bound_s <= top <= planned.iteration_time_s
    assert found_config(planned, profile, hw, "plan.json", engine_model(profile))["envpipe_search"]["predicted"][
        "order_iteration_time_s"] == top
    baseline = replace(planned, plan=Plan.at_one_clock(one_f_one_b(2, 8), pipeline.profile.f_max, "1f1b", "b"))
    assert baseline.order_time_s == pytest.approx(pipeline.baseline_time_s)  # 1F1B at the top clock: the baseline


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_stage_tail_per_dtype(dtype: str) -> None:
    """After its last unit a stage steps its optimizer and all-reduces its gradients; bf16 (DeepSpeed's
    BF16_Optimizer) steps only the replica's partition and all-gathers the weights (H200: P=1, D=2 took
    half the profiled step). Worked out by hand from the profile's numbers and the cluster's links."""
    profile = layer_profile([2.0, 2.0, 2.0, 6.0], params=[2_000_000] * 4, dtype=dtype)
    hw = cluster(1, 2)
    cut = Cut((4,), 0.0)
    step = 4 * 2e-3  # 1 ms per million parameters and layer
    weights = 4 * 2_000_000 * (4 if dtype == "fp32" else 2)
    allreduce = 2 * (20e-6 + weights / (2 * 100e9))  # ring, D = 2
    expected = {"fp32": step + allreduce, "bf16": step / 2 + allreduce + allreduce / 2}[dtype]
    inputs = SearchInputs.of(profile, hw, SIMULATED_GPU)
    pipeline = build_pipeline(inputs, Shape(1, 2, 1, 4), cut, MemoryTables(profile, 1, 2, 4))
    assert pipeline.tail_s[0] == pytest.approx(expected)
    alone = build_pipeline(inputs, Shape(1, 1, 1, 4), cut, MemoryTables(profile, 1, 1, 4))
    assert alone.tail_s[0] == pytest.approx(step)  # one replica: no collective, the whole step
    engine = replace(SIMULATED_GPU, iteration_s=0.25)  # the engine's own work per iteration joins the tail
    assert build_pipeline(SearchInputs.of(profile, hw, engine), Shape(1, 1, 1, 4), cut,
                          MemoryTables(profile, 1, 1, 4)).tail_s[0] == pytest.approx(step + 0.25)


def test_no_configuration_fits() -> None:
    with pytest.raises(SearchError) as err:
        search(SearchInputs.of(layer_profile([1.0] * 5), cluster(1, 2, 1.0)), 8, Objective())
    text = str(err.value)
    assert text.startswith("no configuration fits 0.00 GiB per GPU less the 0.00 GiB margin: the least device "
                           "memory any of the 6 shapes needs is")
    assert "\n" not in text


def test_a_gpu_count_the_shape_cannot_use() -> None:
    with pytest.raises(SearchError) as err:
        search(SearchInputs.of(layer_profile([1.0] * 4), cluster(1, 7)), 8, Objective())
    assert str(err.value) == (
        "no pipeline shape uses 7 GPUs: the stages P must divide 7 and be at most the profile's 4 layers "
        "(P in [1]), and the global batch 8 must be a multiple of D x b (replicas D = 7 / P, micro-batch size b in "
        "the profile's [1, 2, 4])")


@pytest.mark.parametrize(("objective", "message"), [
    (dict(kind="fastest"), "unknown objective 'fastest'"),
    (dict(kind="energy"), "the energy objective needs exactly one throughput floor"),
    (dict(kind="energy", min_throughput=1.0, max_slowdown=0.1), "needs exactly one throughput floor"),
    (dict(kind="throughput", max_slowdown=0.1), "belongs to the energy objective"),
    (dict(kind="energy", min_throughput=-1.0), "must be positive"),
])
def test_objective_errors(objective: dict, message: str) -> None:
    with pytest.raises(SearchError, match=message):
        Objective(**objective)


def test_throughput_floor_nobody_reaches() -> None:
    with pytest.raises(SearchError, match="no configuration reaches the throughput floor"):
        search(SearchInputs.of(layer_profile([1.0] * 4), cluster()), 8, Objective("energy", min_throughput=1e9))


@pytest.fixture(scope="module")
def everything():
    """A small search space and every feasible pipeline of it, planned without pruning."""
    profile = layer_profile([1.0, 3.0, 3.0, 3.0, 3.0, 2.0], act_mib=[1.0, 8.0, 8.0, 8.0, 8.0, 30.0],
                            params=[8_000_000] * 6)  # a frontier of several points: all-reduce against bubbles
    hw = cluster(1, 4, 1 << 14)
    full = search(SearchInputs.of(profile, hw), 16, Objective("throughput"), SearchOptions(top_k=100))
    return profile, hw, full.candidates


def test_bounds_hold(everything) -> None:
    _, _, planned = everything
    for c in planned:
        p = c.pipeline
        assert p.time_lower_bound_s <= c.iteration_time_s * (1 + 1e-9)
        assert p.energy_lower_bound_j() <= c.energy_j * (1 + 1e-9)


def test_frontier_pruning_loses_no_point(everything) -> None:
    profile, hw, planned = everything
    truth = {(round(c.iteration_time_s, 12), round(c.energy_j, 9)) for c in planned
             if not any(d.iteration_time_s <= c.iteration_time_s and d.energy_j <= c.energy_j
                        and (d.iteration_time_s, d.energy_j) != (c.iteration_time_s, c.energy_j) for d in planned)}
    result = search(SearchInputs.of(profile, hw), 16, Objective("frontier"))
    assert {(round(c.iteration_time_s, 12), round(c.energy_j, 9)) for c in result.candidates} == truth
    assert len(truth) >= 3 and result.stats.pruned > 0  # a real frontier, and the bounds did prune


def test_energy_objective_finds_the_least_energy(everything) -> None:
    profile, hw, planned = everything
    floor = min(c.iteration_time_s for c in planned) * 1.3
    budget_ok = [plan_pipeline(c.pipeline, hw.memory_bytes, floor) for c in planned
                 if c.pipeline.baseline_time_s <= floor]
    result = search(SearchInputs.of(profile, hw), 16, Objective("energy", max_slowdown=0.3), SearchOptions(top_k=2))
    assert result.time_budget_s == pytest.approx(floor)
    assert result.candidates[0].energy_j == pytest.approx(min(c.energy_j for c in budget_ok))
    assert all(c.iteration_time_s <= floor * (1 + 1e-9) for c in result.candidates)
    assert result.stats.pruned + result.stats.too_slow > 0


def test_throughput_objective_ranks_by_time(everything) -> None:
    profile, hw, planned = everything
    result = search(SearchInputs.of(profile, hw), 16, Objective("throughput"), SearchOptions(top_k=2))
    fastest = sorted(planned, key=lambda c: c.pipeline.baseline_time_s)[:2]
    assert [c.shape for c in result.candidates] == [c.shape for c in sorted(fastest, key=lambda c: c.iteration_time_s)]
    assert result.stats.pruned == len(planned) - 2


def test_iterations_too_large_for_the_planner_keep_the_baseline(everything) -> None:
    profile, hw, _ = everything
    result = search(SearchInputs.of(profile, hw), 16, Objective("throughput"),
                    SearchOptions(top_k=100, max_plan_units=16))
    for c in result.candidates:
        small = 2 * c.shape.stages * c.shape.microbatches <= 16
        assert c.planned == small
        if not small:
            assert c.order == "1f1b (not planned)" and c.saving == 0
            assert {u.freq_mhz for units in c.plan.stages for u in units} == {int(c.pipeline.profile.f_max)}
            assert c.iteration_time_s == pytest.approx(c.pipeline.baseline_time_s)
    assert result.stats.not_planned == sum(not c.planned for c in result.candidates) > 0

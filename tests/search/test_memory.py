"""The stage memory model, term by term, on profiles whose numbers are worked out by hand: static memory per
dtype, in-flight activations, workspaces, the logits the engine keeps, the optimizer step, and the device's
memory beyond the allocator's peak; the search refuses what does not fit with the margin, in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from envpipe.cli import main
from envpipe.search.cluster import communicators
from envpipe.search.cut import Cut
from envpipe.search.engine_model import SIMULATED_GPU, EngineModel, device_overhead, engine_model
from envpipe.search.evaluate import build_pipeline, stage_memory
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import DeviceMemory
from envpipe.search.memory import DeviceOverhead, MemoryTables
from envpipe.search.space import Shape
from tests.support.layer_profiles import MIB, cluster, layer_profile


def test_stage_bytes_by_hand_fp32() -> None:
    # 3 layers, 1 M parameters each (4 MB fp32), activations 4 MiB, output 1 MiB, logits 3 MiB per sample (b = 2)
    profile = layer_profile([1.0, 1.0, 1.0], act_mib=[4.0, 4.0, 4.0], params=[1_000_000] * 3)
    tables = MemoryTables(profile, 2, 1, 8)
    stage = tables.stage(1, 3)  # layers 1 and 2: a second, last stage
    weights = 4_000_000
    assert stage.static == 2 * (weights + weights + 8_000_000)  # weights + gradients + AdamW moments
    # both layers' activations + the received input twice (the pipe buffer and the forward's copy of it)
    assert stage.per_microbatch == 2 * 8 * MIB + 2 * 2 * MIB
    # largest workspace: max(forward peak - held, backward peak) = max(1.5 - 1, 0.5) x activations; the last
    # stage receives no gradient
    assert stage.transient == 4 * MIB
    assert stage.step_transient == 2 * 4_000_000  # device "test" takes the GPU's foreach path: summed
    # the last stage's pipe buffers keep two logits tensors (6 MiB at b = 2): one more than the one in flight
    # during the units, both during the step
    assert (stage.kept_units, stage.kept_step) == (6 * MIB, 12 * MIB)
    assert stage.peak(3) == stage.static + 6 * MIB + 3 * stage.per_microbatch + stage.transient
    first = tables.stage(0, 1)
    assert first.per_microbatch == 8 * MIB and first.transient == 4 * MIB + 2 * MIB  # + the gradient received
    assert first.kept_units == first.kept_step == 0  # only the last stage keeps its outputs


def test_one_micro_batch_keeps_one_logits_tensor() -> None:
    profile = layer_profile([1.0, 1.0, 1.0])
    stage = MemoryTables(profile, 1, 1, 1).stage(0, 3)
    assert (stage.kept_units, stage.kept_step) == (0, 3 * MIB)


def test_bf16_optimizer_state_is_split_over_replicas() -> None:
    profile = layer_profile([1.0, 1.0, 1.0], params=[1_000_000] * 3, dtype="bf16")
    one, four = MemoryTables(profile, 1, 1, 4).stage(0, 3), MemoryTables(profile, 1, 4, 4).stage(0, 3)
    weights = 3 * 2_000_000
    assert one.static == 3 * weights + 3 * 12_000_000  # bf16 weights, grads, accumulation; fp32 master + moments
    assert four.static == 3 * weights + 3 * 12_000_000 // 4
    assert four.step_transient == one.step_transient // 4
    # P = 1 at b = 1: the step is the peak (static + 2 logits + the fp32 gradient cast and AdamW's temporaries)
    assert one.peak(1) == one.static + 2 * 3 * MIB + one.step_transient


def test_device_overhead_by_hand() -> None:
    overhead = DeviceOverhead(workspace_bytes=24 * MIB, fragmentation=0.25, outside_allocator_bytes=500 * MIB)
    # (1000 + 24) MiB allocated, a quarter more reserved (1280 MiB), 500 MiB outside the allocator
    assert overhead.device_bytes(1000 * MIB) == 1780 * MIB
    assert overhead.allocatable(1780 * MIB) == 1000 * MIB
    engine = EngineModel(0.0, 0.0, 1.0, 0.25, 100 * MIB, "", "test")
    profile = layer_profile([1.0] * 3, device_memory=DeviceMemory(80 << 30, 400 * MIB, 24 * MIB, "test"))
    assert device_overhead(profile, engine) == overhead  # the profile's context + the engine's NCCL


def test_planner_memory_model() -> None:
    """What the planner gets: per-micro-batch bytes, and what is left after static memory and workspace."""
    profile = layer_profile([1.0, 1.0, 1.0, 1.0], params=[1_000_000] * 4)
    hw = cluster(1, 2, 64)
    tables = MemoryTables(profile, 1, 1, 4)
    pipeline = build_pipeline(SearchInputs.of(profile, hw, SIMULATED_GPU), Shape(2, 1, 1, 4), Cut((2, 2), 0.0), tables)
    memory = stage_memory(pipeline, hw.memory_bytes)
    for s, (a, b) in enumerate(((0, 2), (2, 4))):
        stage = tables.stage(a, b)
        assert memory.activation_bytes[s] == stage.per_microbatch
        assert memory.available_bytes[s] == hw.memory_bytes - stage.static - stage.kept_units - stage.transient


def test_graphed_stages_hold_a_recordings_pool_per_micro_batch_in_flight() -> None:
    """Units replayed as CUDA graphs: each micro-batch in flight has a recording whose pool keeps its activations
    and its units' workspace all iteration, the optimizer step included; the first, eager iteration's peak stays
    a floor; the planner charges a micro-batch its pool."""
    profile = layer_profile([1.0, 1.0, 1.0], act_mib=[4.0, 4.0, 4.0], params=[1_000_000] * 3)
    eager, graphed = MemoryTables(profile, 2, 1, 8).stage(1, 3), MemoryTables(profile, 2, 1, 8, True).stage(1, 3)
    assert graphed.graphed and not eager.graphed
    weights = 2 * 4_000_000  # layers 1 and 2, 4 MB of fp32 weights each: their gradients
    assert graphed.gradients == weights and graphed.loss == 7 * 6 * MIB  # seven logits tensors at b = 2
    pool = max(eager.per_microbatch, weights + eager.transient)
    rest = eager.static + weights + max(eager.kept_units + graphed.loss, eager.kept_step + eager.step_transient)
    for in_flight in (1, 3):
        assert graphed.peak(in_flight) == max(eager.peak(in_flight), rest + in_flight * pool)
    assert graphed.peak(3) > eager.peak(3)
    assert (graphed.per_in_flight, graphed.room_taken) == (pool, rest)
    assert (eager.per_in_flight, eager.room_taken) == (eager.per_microbatch,
                                                       eager.static + eager.kept_units + eager.transient)
    tables = MemoryTables(profile, 2, 1, 8, True)
    assert tables.peak(3)[1, 3] == graphed.peak(3)  # the cut search's table says the same


def test_the_search_refuses_what_does_not_fit_with_the_margin(tmp_path) -> None:
    """A GPU profile knows its device's memory; the margin decides: the configuration fits with a margin 1 MiB
    below what the device has left over its predicted peak, and is refused, in one line, with one 1 MiB above."""
    device = DeviceMemory(4 << 30, 100 * MIB, 10 * MIB, "test")
    profile = layer_profile([1.0] * 4, params=[10_000_000] * 4, sizes=(1,), device_memory=device)
    path = tmp_path / "layers.json"
    profile.save(path)
    need = device_overhead(profile, engine_model(profile)).device_bytes(MemoryTables(profile, 1, 1, 2).peak(1)[0, 4])
    spare_gib = ((4 << 30) - need) / (1 << 30)
    args = ["search", "--layers", str(path), "--gpus-per-node", "1", "--global-batch", "2"]
    fits = CliRunner().invoke(main, [*args, "--out-dir", str(tmp_path / "fits"), "--memory-margin-gib",
                                     str(spare_gib - 1 / 1024)])
    assert fits.exit_code == 0, fits.output
    assert "4.00 GiB per GPU (the device's, from" in fits.output
    refused = CliRunner().invoke(main, [*args, "--out-dir", str(tmp_path / "out"), "--memory-margin-gib",
                                        str(spare_gib + 1 / 1024)])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    errors = [line for line in refused.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and errors[0].startswith(
        f"Error: no configuration fits 4.00 GiB per GPU less the {spare_gib + 1 / 1024:.2f} GiB margin: the least "
        f"device memory any of the 1 shapes needs is {need / (1 << 30):.2f} GiB (P=1 D=1 b=1 M=2")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("stages", "replicas", "stage", "expected"), [
    (1, 1, 0, 0),  # one GPU: its groups are of one rank, in the engine model's fit
    (1, 2, 0, 3),  # the world, PipelineModule's group, the data-parallel group (the NCCL log of 2 x H200: 3)
    (2, 1, 0, 6),  # the world, PipelineModule's, the pipe and model groups, a link's two (the NCCL log: 6)
    (2, 1, 1, 6),
    (4, 1, 1, 8),  # a middle stage has two links
    (2, 2, 1, 7),
])
def test_the_communicators_a_rank_holds(stages: int, replicas: int, stage: int, expected: int) -> None:
    assert communicators(stages, replicas, stage) == expected


def test_a_stage_needs_its_communicators_memory() -> None:
    """A communicator's measured memory is added outside the allocator per stage, times the stage's communicators:
    a middle stage holds two more than the first; what the planner may give micro-batches shrinks by as much."""
    profile = layer_profile([1.0] * 6, params=[1_000_000] * 6)
    engine = EngineModel(0.0, 0.0, 1.0, 0.0, 0, "", "test")
    hw = replace(cluster(1, 4, 1 << 14), communicator_bytes=300 * MIB)
    tables = MemoryTables(profile, 1, 1, 4)
    pipeline = build_pipeline(SearchInputs.of(profile, hw, engine), Shape(3, 1, 1, 4), Cut((2, 2, 2), 0.0), tables)
    outside = [o.outside_allocator_bytes for o in pipeline.overheads]
    assert outside == [6 * 300 * MIB, 8 * 300 * MIB, 6 * 300 * MIB]
    plain = build_pipeline(SearchInputs.of(profile, cluster(1, 4, 1 << 14), engine), Shape(3, 1, 1, 4),
                           Cut((2, 2, 2), 0.0), tables)
    memory, without = stage_memory(pipeline, hw.memory_bytes), stage_memory(plain, hw.memory_bytes)
    assert [a - b for a, b in zip(without.available_bytes, memory.available_bytes, strict=True)] == outside

"""The stage memory model on a profile whose numbers are worked out by hand."""

from __future__ import annotations

from envpipe.search.cut import Cut
from envpipe.search.evaluate import build_pipeline, stage_memory
from envpipe.search.memory import MemoryTables
from envpipe.search.space import Shape
from tests.search.profiles import MIB, cluster, layer_profile


def test_stage_bytes_by_hand_fp32() -> None:
    # 3 layers, 1 M parameters each (4 MB fp32), activations 4 MiB, output 1 MiB per sample (b = 2)
    profile = layer_profile([1.0, 1.0, 1.0], act_mib=[4.0, 4.0, 4.0], params=[1_000_000] * 3)
    tables = MemoryTables(profile, 2, 1)
    stage = tables.stage(1, 3)  # layers 1 and 2: a second stage
    weights = 4_000_000
    assert stage.static == 2 * (weights + weights + 8_000_000)  # weights + gradients + AdamW moments
    assert stage.per_microbatch == 2 * 8 * MIB + 2 * MIB  # both layers' activations + the received input
    # largest workspace: max(forward peak - held, backward peak) = max(1.5 - 1, 0.5) x activations; the last
    # stage receives no gradient
    assert stage.transient == 4 * MIB
    assert stage.step_transient == 2 * 4_000_000  # device "test" takes the GPU's foreach path: summed
    assert stage.peak(3) == stage.static + 3 * stage.per_microbatch + stage.transient
    first = tables.stage(0, 1)
    assert first.per_microbatch == 8 * MIB and first.transient == 4 * MIB + 2 * MIB  # + the gradient received


def test_bf16_optimizer_state_is_split_over_replicas() -> None:
    profile = layer_profile([1.0, 1.0, 1.0], params=[1_000_000] * 3, dtype="bf16")
    one, four = MemoryTables(profile, 1, 1).stage(0, 3), MemoryTables(profile, 1, 4).stage(0, 3)
    weights = 3 * 2_000_000
    assert one.static == 3 * weights + 3 * 12_000_000  # bf16 weights, grads, accumulation; fp32 master + moments
    assert four.static == 3 * weights + 3 * 12_000_000 // 4
    assert four.step_transient == one.step_transient // 4


def test_planner_memory_model() -> None:
    """What the planner gets: per-micro-batch bytes, and what is left after static memory and workspace."""
    profile = layer_profile([1.0, 1.0, 1.0, 1.0], params=[1_000_000] * 4)
    hw = cluster(1, 2, 64)
    tables = MemoryTables(profile, 1, 1)
    pipeline = build_pipeline(profile, hw, Shape(2, 1, 1, 4), Cut((2, 2), 0.0), tables)
    memory = stage_memory(pipeline, hw.memory_bytes)
    for s, (a, b) in enumerate(((0, 2), (2, 4))):
        stage = tables.stage(a, b)
        assert memory.activation_bytes[s] == stage.per_microbatch
        assert memory.available_bytes[s] == hw.memory_bytes - stage.static - stage.transient

"""What DeepSpeed's pipeline engine adds, on a GPU, to the layers' own time and memory that the layer profile
measures one layer at a time.

Time: the engine's host work before each forward's layers (its instructions, loading the micro-batch,
the synchronization before the forward: envpipe.search.timing) and, once per iteration, its work
around the units and the optimizer step (the loss's aggregation, the end of the schedule).
Memory: how much more the caching allocator reserves than it allocates at its peak (fragmentation), and
what the training process holds outside the allocator beyond the profile's CUDA context (NCCL).

These few numbers are properties of the engine and the host, not of a model: they are fitted once on
declared configurations (benchmarks/search_fit.py over the runs of benchmarks/search_accuracy.py: the
fit set, never the configurations the accuracy is scored on) and checked against the committed fit by
a test. On the CPU's simulated GPU (virtual time, no launches, torch's CPU allocator) they are 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from envpipe.search.layers import LayerProfile
from envpipe.search.memory import DeviceOverhead


@dataclass(frozen=True)
class EngineModel:
    unit_host_s: float  # host work before each forward unit's layers
    iteration_s: float  # per iteration, besides the units and the optimizer step
    reserved_fraction: float  # the allocator's reserved peak over its allocated peak, less 1
    outside_allocator_bytes: int  # beyond the profile's: NCCL's communicators and buffers
    label: str


SIMULATED_GPU = EngineModel(0.0, 0.0, 0.0, 0, "none: the CPU's simulated GPU (virtual time, torch's CPU allocator)")

# benchmarks/results/search_fit.json (benchmarks/search_fit.py); tests/search/test_engine.py refits and compares
GPU = EngineModel(0.0, 0.0, 0.0, 0, "not fitted yet")


def engine_model(layers: LayerProfile) -> EngineModel:
    return SIMULATED_GPU if layers.device == "cpu" else GPU


def device_overhead(layers: LayerProfile, engine: EngineModel) -> DeviceOverhead:
    """The device memory a training process needs besides its allocated peak (envpipe.search.memory)."""
    measured = layers.device_memory
    return DeviceOverhead(measured.workspace_bytes, engine.reserved_fraction,
                          measured.outside_allocator_bytes + engine.outside_allocator_bytes)

"""Layer profiles built in code for the search tests: chosen costs, so that answers can be worked out."""

from __future__ import annotations

from collections.abc import Sequence

from envpipe.search.cluster import Cluster
from envpipe.search.layers import NO_DEVICE_MEMORY, DeviceMemory, Layer, LayerCost, LayerProfile, ModelShape

MIB = 1 << 20


def layer_profile(times_ms: Sequence[float], act_mib: Sequence[float] | None = None,
                  params: Sequence[int] | None = None, sizes: Sequence[int] = (1, 2, 4), dtype: str = "fp32",
                  out_mib: float = 1.0, logits_mib: float = 3.0, host_ms: Sequence[float] | None = None,
                  device_memory: DeviceMemory = NO_DEVICE_MEMORY) -> LayerProfile:
    """A profile of len(times_ms) layers (embedding, blocks, head): forward = 1/3 and backward = 2/3 of each
    layer's unit time at micro-batch size 1; time grows as b^0.8 with the micro-batch size b (larger ones use
    the GPU better), activations linearly; each layer's output is ``out_mib`` per sample, the head's (the
    logits) ``logits_mib``. ``host_ms``: the host's time per layer unit, split like the device's and the same
    at every micro-batch size (default 0: never launch-bound)."""
    n = len(times_ms)
    act_mib = act_mib or [4.0] * n
    params = params or [1_000_000] * n
    width = 4 if dtype == "fp32" else 2
    host_ms = host_ms or [0.0] * n
    layers = []
    for i, (t, act, count, h) in enumerate(zip(times_ms, act_mib, params, host_ms, strict=True)):
        per = {b: LayerCost(b**0.8 * t / 3e3, 2 * b**0.8 * t / 3e3, int(b * act * MIB),
                            int(b * (logits_mib if i == n - 1 else out_mib) * MIB), int(b * act * MIB * 1.5),
                            int(b * act * MIB / 2), h / 3e3, 2 * h / 3e3) for b in sizes}
        layers.append(Layer("Embedding" if i == 0 else "Head" if i == n - 1 else "Block", count, count * width,
                            8 * count if dtype == "fp32" else 12 * count, 1e-3 * count / 1e6, 4 * count, per))
    return LayerProfile(device="test", cpu_threads=None, dtype=dtype, date="2026-11-23T00:00:00Z",
                        gpu="a100", measured_mhz=None,
                        clock_model="sim-a100", clock_label="test", busy_power_w=300.0, idle_power_w=80.0,
                        power_label="test", model=ModelShape("gpt2", n - 2, 64, 2, 16, 128), layers=tuple(layers),
                        device_memory=device_memory, source="test")


def cluster(nodes: int = 1, gpus_per_node: int = 2, memory_mib: float = 1 << 14) -> Cluster:
    return Cluster(nodes, gpus_per_node, int(memory_mib * MIB), 100e9, 12.5e9, 20e-6, 100e9)

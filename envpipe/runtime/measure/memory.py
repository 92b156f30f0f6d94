"""How many micro-batches' activations a stage can keep in flight: measured, not guessed.

EnvPipe's extra warm-up forwards keep more micro-batches in flight than 1F1B does, and each holds its
activations until its backward. The runtime measures, in one calibration iteration, the bytes of the
tensors every forward saves for its backward (autograd's saved-tensor hooks, parameters excluded: the
same on CPU and GPU) and the stage's static memory (on a GPU what is allocated between iterations:
parameters, gradients, optimizer state; on CPU their tensors' sizes). With the device's memory (or a
configured limit) less a headroom share, that gives each stage's most in-flight micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from envpipe.runtime.summary import MemoryUse


class SavedTensorMeter:
    """Bytes of distinct tensor storages autograd saves for backward between `start` and `stop`."""

    def __init__(self, parameters: Any) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in parameters}
        self._seen: dict[int, int] = {}
        self._hooks: Any = None
        self.per_unit: list[int] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._params:
            self._seen[storage.data_ptr()] = storage.nbytes()
        return t

    def start(self) -> None:
        self._seen = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()

    def stop(self, outputs: Any) -> None:
        self._hooks.__exit__(None, None, None)
        self._hooks = None
        kept = outputs if isinstance(outputs, tuple | list) else (outputs,)
        for t in kept:  # the stage's output stays in its pipe buffer until the backward
            if isinstance(t, torch.Tensor):
                self._seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        self.per_unit.append(sum(self._seen.values()))


def static_bytes(engine: Any) -> int:
    """Memory a stage holds between iterations: on a GPU what is allocated; on CPU parameters, gradients and
    the optimizer's state tensors."""
    if engine.device.type == "cuda":
        return int(torch.cuda.memory_allocated(engine.device))
    params = sum(p.numel() * p.element_size() for p in engine.module.parameters())
    state = getattr(getattr(engine, "optimizer", None), "state", {}) or {}
    opt = sum(t.numel() * t.element_size() for s in state.values() if isinstance(s, dict)
              for t in s.values() if isinstance(t, torch.Tensor))
    return 2 * params + opt


def device_limit(engine: Any, configured: int | None) -> int | None:
    """The configured limit, else a GPU's whole memory; None on CPU without a configured limit."""
    if configured is not None:
        return configured
    if engine.device.type == "cuda":
        return int(torch.cuda.mem_get_info(engine.device)[1])
    return None


def stage_memory(activation_bytes: int, static: int, limit: int | None, headroom: float, planned: int) -> MemoryUse:
    """What the order choice may use: ``planned`` is the in-flight count of the order that runs now."""
    available = fits = None
    if limit is not None:
        available = max(0, math.floor(limit * (1.0 - headroom)) - static)
        fits = available // activation_bytes if activation_bytes > 0 else None
    return MemoryUse(int(activation_bytes), int(static), limit, available, fits, planned)


def with_peak(use: MemoryUse, peak: int | None) -> MemoryUse:
    """``use`` with the allocator's peak while its order ran (GPUs; None on CPU): what the peak held beyond the
    static and in-flight bytes is kept as the stage's transient bytes."""
    if peak is None:
        return use
    held = use.static_bytes + use.planned_in_flight * use.activation_bytes_per_microbatch
    return replace(use, transient_bytes=max(0, peak - held))


def peak_bytes(engine: Any) -> int | None:
    """The allocator's peak so far on a GPU; None on CPU."""
    return int(torch.cuda.max_memory_allocated(engine.device)) if engine.device.type == "cuda" else None

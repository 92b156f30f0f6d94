"""A CPU recorder for envpipe.runtime.engine.graphs: recordings that behave as CUDA graphs do, without CUDA.

A recording owns static tensors, as a CUDA graph does: its inputs, its outputs, the gradients its backward
takes and gives, and (in its "pool") the one set of activations its forward saved. A forward replay recomputes
the forward eagerly from the static inputs and writes the outputs over the static ones; a backward replay
differentiates the activations the last forward saved and writes the gradients over the static ones. So
everything a CUDA graph shares between replays is shared here too, and a runtime that lets two micro-batches
share a recording computes wrong gradients here as it would on a GPU. Where a GPU would do so silently,
this recorder raises: a forward replayed while its last backward is still due, a backward without a forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from envpipe.runtime.engine.graphs import Recording, StageCall, Tensors, leaves_of


class RecordingOverrun(AssertionError):
    """A replay that a CUDA graph would run over live data."""


class CpuGraphs:
    def __init__(self) -> None:
        self.recordings = 0  # made, including any made again
        self.forward_replays = 0
        self.backward_replays = 0
        self.released_after: list[int] = []  # per release_cached, the recordings made before it

    def release_cached(self) -> None:
        self.released_after.append(self.recordings)

    def unavailable(self, device: torch.device) -> str | None:
        return None

    def record(self, forward: StageCall, params: Mapping[str, torch.Tensor], sample: Tensors) -> Recording:
        self.recordings += 1
        inputs = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in sample)
        leaves = leaves_of(params)
        wrt = [t for t in inputs if t.requires_grad] + list(leaves.values())
        with torch.enable_grad():
            returned = forward(leaves, *inputs)  # the warm-up, which also gives the static tensors their shapes
        outputs = (returned,) if isinstance(returned, torch.Tensor) else tuple(returned)
        trained = [o for o in outputs if o.requires_grad]
        grads = torch.autograd.grad(trained, wrt, [torch.ones_like(o) for o in trained], allow_unused=True)
        static_out = tuple(o.detach().clone() for o in outputs)
        grad_outputs = tuple(torch.zeros_like(o) if o.requires_grad else None for o in outputs)
        grad_inputs = tuple(None if g is None else torch.zeros_like(g) for g in grads)
        pool: dict[str, Any] = {}  # the activations of the last forward replay, until its backward

        def replay_forward() -> None:
            if pool:
                raise RecordingOverrun("a recording's forward replayed before the backward of its last forward")
            self.forward_replays += 1
            with torch.enable_grad():
                live = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
                got = forward(leaves, *live)
            got = (got,) if isinstance(got, torch.Tensor) else tuple(got)
            for static, new in zip(static_out, got, strict=True):
                static.copy_(new.detach())
            pool["saved"] = ([t for t in live if t.requires_grad] + list(leaves.values()), got)

        def replay_backward() -> None:
            if not pool:
                raise RecordingOverrun("a recording's backward replayed without a forward")
            self.backward_replays += 1
            saved_wrt, got = pool.pop("saved")
            pairs = [(o, g) for o, g in zip(got, grad_outputs, strict=True) if g is not None]
            new = torch.autograd.grad([o for o, _ in pairs], saved_wrt, [g for _, g in pairs], allow_unused=True)
            for static, grad in zip(grad_inputs, new, strict=True):
                if static is not None:
                    static.copy_(grad if grad is not None else torch.zeros_like(static))

        return Recording(inputs, static_out, grad_outputs, grad_inputs, isinstance(returned, torch.Tensor),
                         replay_forward, replay_backward)

"""Memory of a pipeline stage on DeepSpeed, from the layer profile (bytes of the allocator, as
torch.cuda.max_memory_allocated counts them).

A stage holding layers a..b-1 at micro-batch size m needs

- **static** bytes, held all iteration: per layer its weights, their gradients and the optimizer's state.
  DeepSpeed's pipeline engine keeps, per training dtype (ZeRO stage 0):
  - fp32: the torch optimizer runs on the weights: weights + gradients + optimizer state (AdamW moments);
  - bf16: DeepSpeed's BF16_Optimizer: bf16 weights + bf16 gradients + a gradient-accumulation buffer of
    the same size + the fp32 master weights and moments, the last two split over the data-parallel
    replicas (each replica updates its partition, then the weights are all-gathered);
- **per in-flight micro-batch**: what every layer keeps from its forward to its backward (its
  activations and output), plus, past stage 0, the received input the pipe buffers keep;
- **transient** bytes on top, during one unit: the largest forward or backward workspace of the stage's
  layers and, past the last stage, the gradient received from the next stage; or, all activations freed,
  the optimizer step's workspace (bf16: the fp32 gradients of the replica's partition and AdamW's
  temporaries, all layers at once; fp32: AdamW's temporaries, all layers at once on GPUs where torch
  takes its foreach path, one tensor at a time on CPU).

peak = max(static + in-flight x per micro-batch + transient, static + step workspace). The in-flight count
is the order's (envpipe.plan.memory.peak_in_flight: 1F1B keeps min(M, P-s) on stage s, EnvPipe's order
r_s more). The planner gets the per-micro-batch bytes and what is left for them
(envpipe.search.evaluate.stage_memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.search.cut import segment_max, segment_sums
from envpipe.search.layers import LayerProfile


@dataclass(frozen=True)
class StageBytes:
    static: int
    per_microbatch: int
    transient: int
    step_transient: int

    def peak(self, in_flight: int) -> int:
        return max(self.static + in_flight * self.per_microbatch + self.transient,
                   self.static + self.step_transient)



def state_bytes(profile: LayerProfile, replicas: int) -> np.ndarray:
    """(L,) static bytes per layer: weights, gradients, optimizer state (DeepSpeed's split for the dtype)."""
    weights = np.array([layer.param_bytes for layer in profile.layers], dtype=float)
    optimizer = np.array([layer.optimizer_state_bytes for layer in profile.layers], dtype=float)
    if profile.dtype == "fp32":
        return weights + weights + optimizer
    return 3 * weights + optimizer / replicas


class MemoryTables:
    """Per-segment memory of one (profile, micro-batch size, replicas): the parts of StageBytes for every
    contiguous range of layers [a, b), as (L+1, L+1) tables, so that a cut search reads them in O(1)."""

    def __init__(self, profile: LayerProfile, micro_batch: int, replicas: int) -> None:
        costs = [layer.per_micro_batch[micro_batch] for layer in profile.layers]
        act = np.array([c.activation_bytes for c in costs], dtype=float)
        out = np.array([c.output_bytes for c in costs], dtype=float)
        work = np.array([max(c.forward_peak_bytes - c.activation_bytes, c.backward_peak_bytes) for c in costs],
                        dtype=float)
        step = np.array([layer.optimizer_step_peak_bytes for layer in profile.layers], dtype=float)
        L = len(costs)
        received = np.r_[0.0, out[:-1]]  # stage input = the previous layer's output (none before layer 0)
        grad_in = out.copy()
        grad_in[-1] = 0.0
        first = np.arange(L + 1)[:, None]
        last = np.arange(L + 1)[None, :] - 1
        self.valid = np.triu(np.ones((L + 1, L + 1), dtype=bool), k=1)  # [a, b]: a non-empty stage
        self.static = self._valid(segment_sums(state_bytes(profile, replicas)))
        self.per_microbatch = self._valid(segment_sums(act) + received[np.minimum(first, L - 1)])
        self.transient = self._valid(segment_max(work) + grad_in[np.clip(last, 0, L - 1)])
        if profile.dtype == "bf16":  # BF16_Optimizer steps one flat fp32 partition: its layers' workspaces add up
            self.step = self._valid(segment_sums(step) / replicas)
        elif profile.device == "cpu":  # torch AdamW's per-tensor loop on CPU: one layer's workspace at a time
            self.step = self._valid(segment_max(step))
        else:  # its foreach path on GPUs: every tensor's workspace at once
            self.step = self._valid(segment_sums(step))

    def _valid(self, table: np.ndarray) -> np.ndarray:
        return np.where(self.valid, table, 0.0)

    def stage(self, a: int, b: int) -> StageBytes:
        return StageBytes(int(self.static[a, b]), int(self.per_microbatch[a, b]), int(self.transient[a, b]),
                          int(self.step[a, b]))

    def peak(self, in_flight: int) -> np.ndarray:
        """(L+1, L+1) peak bytes of every segment with ``in_flight`` micro-batches (inf: empty segments)."""
        peak = np.maximum(self.static + in_flight * self.per_microbatch + self.transient, self.static + self.step)
        return np.where(self.valid, peak, np.inf)

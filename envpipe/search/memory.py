"""Memory of a pipeline stage on DeepSpeed's pipeline engine, from the layer profile: first in bytes of the
caching allocator (as torch.cuda.max_memory_allocated counts them), then on the device.

A stage holding layers a..b-1 at micro-batch size m needs

- **static** bytes, held all iteration: per layer its weights, their gradients and the optimizer's state.
  DeepSpeed's pipeline engine keeps, per training dtype (ZeRO stage 0, DeepSpeed's default, which the found
  configuration sets; ZeRO stages 1-3 are not modelled):
  - fp32: the torch optimizer runs on the weights: weights + gradients + optimizer state (AdamW moments);
  - bf16: DeepSpeed's BF16_Optimizer: bf16 weights + bf16 gradients + its flat bf16 gradient-accumulation
    buffer (DeepSpeed's default accumulation dtype for bf16) + the fp32 master weights and moments, the
    last two split over the data-parallel replicas (each replica updates its partition, then the weights
    are all-gathered);
- **per in-flight micro-batch**: what every layer keeps from its forward to its backward (its activations
  and output), plus, past stage 0, the input received from the previous stage twice: the pipe buffer that
  holds it and the copy the engine's forward makes of it (`inputs.clone()`), which the first layer keeps;
- **transient** bytes on top, during one unit: the largest forward or backward workspace of the stage's
  layers and, past the last stage, the gradient received from the next stage; or, all activations freed,
  the optimizer step's workspace (bf16: the fp32 cast of the replica's partition of the gradients and
  AdamW's temporaries, all layers at once; fp32: AdamW's temporaries, all layers at once on GPUs where
  torch takes its foreach path, one tensor at a time on CPU);
- **kept outputs**: the last stage's pipe buffers keep its outputs, the logits, after their backward
  (DeepSpeed frees a stage's outputs after its backward, except on the last stage): with M >= 2 micro-batches
  two buffers, so one more logits tensor than the one in flight during the units, and two during the step.

allocated peak = max(static + kept + in-flight x per micro-batch + transient, static + kept at the step +
step workspace).

With the units replayed as CUDA graphs (envpipe.runtime.engine.graphs) each micro-batch in flight has a recording
whose private memory pool is held all iteration, the optimizer step included: the larger of its activations and its
static gradients (the stage's weights', with the unit's workspace), as the recorded backward frees the one and
makes the other. Outside the pools the stage holds its static bytes and one more gradients' worth (as the fit set's
runs held; the replays' gradient copies are such a set on their way to the optimizer's), and, during the units, its
kept outputs and the loss, computed outside the recordings (``LOSS_LOGITS`` logits tensors at its peak), or, at the
step, what the step holds. The first iteration, before the recordings, is the eager peak, so the peak is the larger
of the two. On one H200 (call7's fit set, benchmarks/results/search_accuracy_call7.md) this put two models' graphed
allocated peaks at micro-batches 1 to 16 within -0.4 to +5.7 % of the measured.

The in-flight count is the order's (envpipe.plan.memory.peak_in_flight: 1F1B keeps
min(M, P-s) on stage s, EnvPipe's order r_s more). The planner gets the per-micro-batch bytes and what is
left for them (envpipe.search.evaluate.stage_memory).

On the device (``DeviceOverhead``): the workspaces that stay allocated once the first matrix products ran
(cuBLAS, measured by the layer profiler) are added; the allocator's fragmentation, what it holds and can
neither reuse nor give back, a fitted fraction of the allocated peak (0 with expandable segments, the
setting the found configuration trains with; torch's default allocator left 7 to 26 % in split blocks
in the first H100 runs, too varied to predict); and outside the allocator the process holds the CUDA
context and library handles (measured by the profiler) and what the engine adds there (NCCL's
communicators and buffers, fitted). The search refuses a configuration whose device peak is above the
device's memory less the user's margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from envpipe.search.cut import segment_max, segment_sums
from envpipe.search.layers import LayerProfile

KEPT_OUTPUT_BUFFERS = 2  # DeepSpeed TrainSchedule.num_pipe_buffers() on the last stage: max(2, min(P - s, M))
# a graphed last stage's loss outside its recordings, in logits tensors (the training dtype's) at its peak: fitted
# on call7's fit set (cross-entropy on the logits cast to fp32: the cast, its log-softmax and their gradients)
LOSS_LOGITS = 7


@dataclass(frozen=True)
class StageBytes:
    """A stage's memory in bytes of the allocator (see the module's docstring)."""

    static: int
    per_microbatch: int
    transient: int
    step_transient: int
    kept_units: int = 0  # outputs the engine keeps beyond the in-flight ones, during the units
    kept_step: int = 0  # and during the optimizer step
    gradients: int = 0  # the weights' gradients
    loss: int = 0  # graphed: the last stage's loss outside its recordings
    graphed: bool = False  # units replayed as CUDA graphs: each micro-batch in flight holds a recording's pool

    def peak(self, in_flight: int) -> int:
        """The allocator's peak with ``in_flight`` micro-batches in flight."""
        eager = max(self.static + self.kept_units + in_flight * self.per_microbatch + self.transient,
                    self.static + self.kept_step + self.step_transient)
        return max(eager, self.room_taken + in_flight * self.per_in_flight) if self.graphed else eager

    @property
    def per_in_flight(self) -> int:
        """What each micro-batch in flight adds (graphed: its recording's pool)."""
        if self.graphed:
            return max(self.per_microbatch, self.gradients + self.transient)
        return self.per_microbatch

    @property
    def room_taken(self) -> int:
        """What the stage holds besides its micro-batches in flight, at its peak."""
        if self.graphed:
            return self.static + self.gradients + max(self.kept_units + self.loss, self.kept_step + self.step_transient)
        return self.static + self.kept_units + self.transient


@dataclass(frozen=True)
class DeviceOverhead:
    """From the allocator's bytes to the device's (see the module's docstring)."""

    workspace_bytes: int  # allocated once and held: cuBLAS workspaces
    fragmentation: float  # what the allocator can neither reuse nor give back, over its allocated peak
    outside_allocator_bytes: int  # CUDA context, library handles, NCCL

    def device_bytes(self, allocated: float) -> int:
        """The device memory a process with this allocated peak holds at its peak."""
        return int(self.device_table(np.asarray(allocated, dtype=float)))

    def device_table(self, allocated: np.ndarray) -> np.ndarray:
        """``device_bytes`` of every allocated peak in ``allocated`` (inf stays inf)."""
        held = np.ceil((allocated + self.workspace_bytes) * (1 + self.fragmentation))
        return held + self.outside_allocator_bytes

    def allocatable(self, device_bytes: float) -> int:
        """The largest allocated peak whose device memory stays within ``device_bytes`` (may be negative)."""
        return (math.floor((device_bytes - self.outside_allocator_bytes) / (1 + self.fragmentation))
                - self.workspace_bytes)


def state_bytes(profile: LayerProfile, replicas: int) -> np.ndarray:
    """(L,) static bytes per layer: weights, gradients, optimizer state (DeepSpeed's split for the dtype)."""
    weights = np.array([layer.param_bytes for layer in profile.layers], dtype=float)
    optimizer = np.array([layer.optimizer_state_bytes for layer in profile.layers], dtype=float)
    if profile.dtype == "fp32":
        return weights + weights + optimizer
    return 3 * weights + optimizer / replicas


class MemoryTables:
    """Per-segment memory of one (profile, micro-batch size, replicas, micro-batches): the parts of StageBytes
    for every contiguous range of layers [a, b), as (L+1, L+1) tables, so that a cut search reads them in O(1)."""

    def __init__(self, profile: LayerProfile, micro_batch: int, replicas: int, microbatches: int,
                 graphed: bool = False) -> None:
        self.graphed = graphed
        costs = [layer.per_micro_batch[micro_batch] for layer in profile.layers]
        act = np.array([c.activation_bytes for c in costs], dtype=float)
        out = np.array([c.output_bytes for c in costs], dtype=float)
        work = np.array([max(c.forward_peak_bytes - c.activation_bytes, c.backward_peak_bytes) for c in costs],
                        dtype=float)
        step = np.array([layer.optimizer_step_peak_bytes for layer in profile.layers], dtype=float)
        L = len(costs)
        received = 2 * np.r_[0.0, out[:-1]]  # the previous layer's output, buffered and copied (none before layer 0)
        grad_in = out.copy()
        grad_in[-1] = 0.0  # nothing comes back to the last stage
        kept = min(KEPT_OUTPUT_BUFFERS, microbatches)
        ends_last = np.arange(L + 1)[None, :] == L  # [a, b]: the segment holds the head
        first = np.arange(L + 1)[:, None]
        last = np.arange(L + 1)[None, :] - 1
        self.valid = np.triu(np.ones((L + 1, L + 1), dtype=bool), k=1)  # [a, b]: a non-empty stage
        self.static = self._valid(segment_sums(state_bytes(profile, replicas)))
        self.per_microbatch = self._valid(segment_sums(act) + received[np.minimum(first, L - 1)])
        self.transient = self._valid(segment_max(work) + grad_in[np.clip(last, 0, L - 1)])
        logits = float(out[-1])
        self.kept_units = self._valid(np.where(ends_last, (kept - 1) * logits, 0.0))
        self.kept_step = self._valid(np.where(ends_last, kept * logits, 0.0))
        self.gradients = self._valid(segment_sums(np.array([layer.param_bytes for layer in profile.layers], float)))
        self.loss = self._valid(np.where(ends_last, LOSS_LOGITS * logits, 0.0))
        if profile.dtype == "bf16":  # BF16_Optimizer steps one flat fp32 partition: its layers' workspaces add up
            self.step = self._valid(segment_sums(step) / replicas)
        elif profile.device == "cpu":  # torch AdamW's per-tensor loop on CPU: one layer's workspace at a time
            self.step = self._valid(segment_max(step))
        else:  # its foreach path on GPUs: every tensor's workspace at once
            self.step = self._valid(segment_sums(step))

    def _valid(self, table: np.ndarray) -> np.ndarray:
        return np.where(self.valid, table, 0.0)

    def stage(self, a: int, b: int) -> StageBytes:
        static, per, transient, step, kept_units, kept_step, gradients, loss = (int(t[a, b]) for t in (
            self.static, self.per_microbatch, self.transient, self.step, self.kept_units, self.kept_step,
            self.gradients, self.loss))
        return StageBytes(static, per, transient, step, kept_units, kept_step, gradients, loss, self.graphed)

    def peak(self, in_flight: int) -> np.ndarray:
        """(L+1, L+1) allocated peak of every segment with ``in_flight`` micro-batches (inf: empty segments), as
        StageBytes.peak."""
        peak = np.maximum(self.static + self.kept_units + in_flight * self.per_microbatch + self.transient,
                          self.static + self.kept_step + self.step)
        if self.graphed:
            pools = in_flight * np.maximum(self.per_microbatch, self.gradients + self.transient)
            rest = self.static + self.gradients + np.maximum(self.kept_units + self.loss, self.kept_step + self.step)
            peak = np.maximum(peak, rest + pools)
        return np.where(self.valid, peak, np.inf)

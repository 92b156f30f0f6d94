"""The one cost rule of the simulated GPU: what a piece of work lasts on it at its highest clock.

Work is counted, never timed: a unit's FLOPs (torch's FLOP counter on the caller's side, `FlopCount`), an
optimizer step's parameters, a message's bytes. Each goes at a FIXED nominal rate, so the simulated GPU's
seconds do not depend on the machine's speed or load, and two runs of the same job give the same numbers.
(The rule before took the rate from the first calibration iteration's CPU time: absolute numbers moved by
29 % between runs.) The rates are not a real GPU's: they are chosen so that `make demo`'s units last
milliseconds, about what the CPU itself takes for them (a 2-stage 4-block GPT-2 of hidden 192: forward
units of 0.74-1.04 GFLOP, 7-10 ms here; 18-20 ms of one CPU thread), and so that a stage's transfer and
optimizer step keep a realistic share of its iteration.

Clock and power are not here: the seconds are at the GPU's highest clock, and `envpipe.simgpu.gpu.SimGpu`
stretches them by its hidden truth (`envpipe.simgpu.truth`).
"""

from __future__ import annotations

from dataclasses import dataclass

NOMINAL_FLOPS_PER_S = 1e11  # 100 GFLOP/s: a unit's FLOPs -> seconds
NOMINAL_BYTES_PER_S = 1e10  # 10 GB/s of device memory traffic: an optimizer step's bytes -> seconds
MIN_UNIT_S = 10e-6  # a unit without counted FLOPs (e.g. an embedding lookup) still launches kernels
# torch AdamW on fp32 weights reads weight, gradient and both moments (16 B) and writes weight and moments (12 B)
ADAMW_BYTES_PER_PARAMETER = 28


@dataclass(frozen=True)
class Link:
    """The simulated link between neighbouring GPUs: PCIe 4.0 x16-like, so that a stage waiting for its input
    sees the wait a real one would, not none."""

    latency_s: float = 10e-6  # per message
    bytes_per_s: float = 25e9

    def transfer_s(self, nbytes: int) -> float:
        """How long ``nbytes`` take from one GPU to its neighbour."""
        if nbytes < 0:
            raise ValueError(f"a message has a non-negative size, got {nbytes} bytes")
        return self.latency_s + nbytes / self.bytes_per_s

    def allreduce_s(self, nbytes: int, ranks: int) -> float:
        """A ring all-reduce of ``nbytes`` over ``ranks`` GPUs: 2 (n - 1) steps of nbytes / n each."""
        if ranks < 1:
            raise ValueError(f"an all-reduce needs at least one rank, got {ranks}")
        if ranks == 1:
            return 0.0
        steps = 2 * (ranks - 1)
        return steps * self.transfer_s(0) + steps * nbytes / ranks / self.bytes_per_s


LINK = Link()


def unit_s(flops: float) -> float:
    """Seconds of a forward or backward unit (or one layer's part of it) at the highest clock."""
    if not flops >= 0:  # also refuses NaN
        raise ValueError(f"a unit's FLOPs must be a non-negative number, got {flops!r}")
    return max(flops / NOMINAL_FLOPS_PER_S, MIN_UNIT_S)


def step_s(parameters: int, bytes_per_parameter: float = ADAMW_BYTES_PER_PARAMETER) -> float:
    """Seconds of an optimizer step over ``parameters`` (memory-bound: its bytes at the nominal bandwidth)."""
    if parameters < 0 or not bytes_per_parameter >= 0:
        raise ValueError("an optimizer step needs a non-negative parameter count and bytes per parameter")
    return parameters * bytes_per_parameter / NOMINAL_BYTES_PER_S

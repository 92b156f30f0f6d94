"""A delay on the GPU: one warp spinning on the GPU's nanosecond timer (`%globaltimer`) until a set time has passed.

The rehearsal (envpipe.runtime.phases.rehearse) stretches a unit by the extra time its planned clock would cost, so the
delay must last a time, not an amount of work: `torch.cuda._sleep` counts clock cycles, and under a power cap the
clock moves (one H100, 2026-11-28, clocks untouched: `_sleep` calibrated for 2,000 us lasted 869 us after
power-capped GEMMs), while `%globaltimer` runs at a fixed rate whatever the SM clock. Each delay writes the time it
spun into its slot of a device buffer, so what was inserted is read back once per iteration, not per unit.

The kernel is Triton's (shipped with PyTorch's CUDA builds); it is compiled once, at `Spinner()`.
"""

from __future__ import annotations

from typing import Any

MAX_DELAYS = 4096  # delays per iteration (one per unit at most: micro-batches x 2)


class RehearsalUnavailable(RuntimeError):
    """The GPU delay cannot be built here (one line)."""


def _kernel() -> Any:
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise RehearsalUnavailable(f"'rehearse' needs Triton for its GPU delay (PyTorch's CUDA builds ship it): "
                                   f"{exc}") from None

    # one compiled kernel whatever the slot and the time (Triton would specialise integers divisible by 16)
    @triton.jit(do_not_specialize=["slot", "ns"])  # type: ignore[misc]
    def spin(out_ptr, slot, ns):  # type: ignore[no-untyped-def]  # Triton reads annotations as its own types
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        now = t0
        while now - t0 < ns:
            now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                            pack=1)
        tl.store(out_ptr + slot, now - t0)

    return spin


class Spinner:
    """Delays on the current CUDA stream of ``device``, each one's spun time kept until `inserted_s`."""

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self._spin = _kernel()
        self._spun = torch.zeros(MAX_DELAYS, dtype=torch.int64, device=device)
        self._next = 0
        self.delay(0.0)  # compile now, not inside a measured iteration
        self.inserted_s()

    def delay(self, seconds: float) -> None:
        """Enqueue a delay of ``seconds`` on the current stream (returns at once)."""
        if self._next >= MAX_DELAYS:
            raise RuntimeError(f"more than {MAX_DELAYS} delays in one iteration")
        self._spin[(1,)](self._spun, self._next, int(seconds * 1e9), num_warps=1)
        self._next += 1

    def inserted_s(self) -> float:
        """The time the delays since the last call spun, in seconds (waits for them: one copy to the host)."""
        n, self._next = self._next, 0
        return float(self._spun[:n].sum().item()) / 1e9 if n else 0.0

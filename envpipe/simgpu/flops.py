"""Counting a unit's FLOPs with torch's FLOP counter, for the simulated GPU's cost rule (`envpipe.simgpu.cost`).

torch is imported when a count starts, not when this module is imported: envpipe.simgpu stays importable
where only numpy is installed. Usable as a context manager (the layer profiler times a callable) or with
`start`/`stop` (the pipeline engine opens the count in one instruction and closes it in the next).
"""

from __future__ import annotations

from typing import Any


class FlopCount:
    """The FLOPs of what runs between `start` and `stop` (or inside ``with``) on this thread."""

    def __init__(self) -> None:
        self._mode: Any = None
        self.flops: float | None = None  # set by stop

    def start(self) -> FlopCount:
        if self._mode is not None:
            raise RuntimeError("this FLOP count is already running")
        from torch.utils.flop_counter import FlopCounterMode

        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()
        return self

    def stop(self) -> float:
        if self._mode is None:
            raise RuntimeError("this FLOP count was not started")
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        self.flops = float(mode.get_total_flops())
        return self.flops

    def __enter__(self) -> FlopCount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""One GPU as the daemon runs it: its serial path, its driver worker, what the daemon set and last read.

Every operation that changes a GPU or its line in the state file (lock, reset, the reset retries) runs
on the GPU's serial path: queued in the order it was asked for, and run to its end even if the caller
that asked stops waiting (a client that hangs up mid-lock). So a lease's reset and the next lease's lock
never interleave, and what the daemon recorded (``locked_mhz``, the state file) is what the GPU has
whenever no operation is running. Driver calls themselves run on the GPU's worker thread with a
deadline (workers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from envpipe.clock.backends import GpuStatic
from envpipe.clock.workers import SerialWorker

T = TypeVar("T")


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Nobody may await an operation whose caller went away: read its outcome, so asyncio does not
    report an exception that the caller already answered (or had no one to answer to)."""
    if not task.cancelled():
        task.exception()


class ManagedGpu:
    def __init__(self, static: GpuStatic, deadline_s: float, blocking: bool) -> None:
        self.static = static
        self.uuid = static.uuid
        self.locked_mhz: int | None = None  # what the daemon locked; None: default (or unknown after a fault)
        self.fault: str | None = None  # why the GPU is unhealthy; None while healthy
        self.current_mhz: int | None = None  # the last reading, answered while the GPU is unhealthy
        self.energy_mj: int | None = None
        self.timeouts = 0  # driver calls past their deadline
        # A backend whose calls cannot block (sim) runs inline: in order anyway on the one loop thread.
        self.worker = SerialWorker(f"GPU {self.uuid}", deadline_s) if blocking else None
        self._last: asyncio.Task[Any] | None = None  # the newest operation on the serial path

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """One driver call, on the worker thread (GpuTimeout past the deadline)."""
        return fn(*args) if self.worker is None else await self.worker.call(fn, *args)

    def serial(self, operation: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Queue ``operation`` behind every operation queued on this GPU before it. It is queued before
        this returns, so operations keep the order of the calls that asked for them."""
        before = self._last

        async def after_the_others() -> T:
            if before is not None and not before.done():
                await asyncio.wait([before])
            return await operation()

        task = asyncio.get_running_loop().create_task(after_the_others())
        task.add_done_callback(_retrieve)
        self._last = task
        return task

    async def idle(self) -> None:
        """Wait until every operation queued so far has ended."""
        if self._last is not None and not self._last.done():
            await asyncio.wait([self._last])

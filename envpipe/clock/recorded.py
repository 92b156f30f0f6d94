"""The GPUs the daemon may have moved off their default clocks: in memory, and on disk in the state file.

Writes go through a worker thread with a deadline (a hung disk costs one deadline, never the event loop).
A write that fails raises StateUnwritable and marks the record unwritable (``error``: /readyz says so)
until a write succeeds again; a failed removal leaves the GPU named on disk, which only costs the next
start one reset too many. The service calls ``name`` and ``drop`` on each GPU's serial path, so what is
recorded is what the GPUs have whenever no operation runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from envpipe.clock.errors import GpuTimeout, StateUnwritable
from envpipe.clock.logs import event, log
from envpipe.clock.state import Entry, StateFile
from envpipe.clock.workers import SerialWorker


class Recorded:
    def __init__(self, state: StateFile | None, deadline_s: float, on_health: Callable[[], None]) -> None:
        """``on_health`` is called whenever ``error`` changes."""
        self.state, self.on_health = state, on_health
        self._gpus: dict[str, Entry] = {}
        self._writer = SerialWorker("state file", deadline_s) if state else None
        self.error: str | None = None  # why the last write failed; None while the file is written

    def gpus(self) -> set[str]:
        return set(self._gpus)

    async def start(self, gpus: dict[str, Entry]) -> None:
        """Record ``gpus`` (what a start resets) and write it: StateUnwritable before any clock changes."""
        self._gpus = dict(gpus)
        await self.write()

    async def write(self) -> None:
        if self.state is None or self._writer is None:
            return
        try:
            await self._writer.call(self.state.save, dict(self._gpus))
        except (OSError, GpuTimeout) as exc:
            why = exc.message if isinstance(exc, GpuTimeout) else f"{exc.strerror or exc}"
            if self.error is None:
                log.error(event("state_unwritable", path=self.state.path, error=why))
            self.error = why
            self.on_health()
            raise StateUnwritable(f"cannot write the state file {self.state.path}: {why}") from None
        if self.error is not None:
            log.info(event("state_writable", path=self.state.path))
            self.error = None
            self.on_health()

    async def name(self, uuid: str, lease: str, owner: str) -> None:
        """Write ahead: the file names the GPU, and the lease, before its clock changes (StateUnwritable:
        nothing changed, the clock must not either)."""
        before = self._gpus.get(uuid)
        if before is not None and before.lease == lease:
            return  # every further lock of the same lease is free
        self._gpus[uuid] = Entry(lease, owner, time.time())
        try:
            await self.write()
        except StateUnwritable:
            if before is None:
                del self._gpus[uuid]
            else:
                self._gpus[uuid] = before
            raise

    async def drop(self, uuid: str) -> None:
        """The GPU is at its default clock again."""
        if self._gpus.pop(uuid, None) is not None:
            with contextlib.suppress(StateUnwritable):  # stays named on disk, rewritten once it can be
                await self.write()

    def stop(self) -> None:
        if self._writer is not None:
            self._writer.stop()

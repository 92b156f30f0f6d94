"""The daemon's GPUs and their health: a driver call past its deadline, or a failed reset, makes a GPU
unhealthy; its reset is then retried, with a growing pause, until it succeeds (the only way back).

What a fault means beyond the GPU (its lease ends, readiness drops) and what a recovery writes (the audit
log, the state file) is the service's: it is told through ``on_fault`` and ``on_recovered``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from envpipe.clock.backends import Backend
from envpipe.clock.errors import ClockError, GpuTimeout, GpuUnhealthy, UnknownGpu
from envpipe.clock.gpus import ManagedGpu
from envpipe.clock.logs import audit, event, log

T = TypeVar("T")


class GpuHealth:
    def __init__(
        self,
        backend: Backend,
        deadline_s: float,
        retry_s: tuple[float, float],
        on_fault: Callable[[ManagedGpu], None],
        on_recovered: Callable[[ManagedGpu], Awaitable[None]],
    ) -> None:
        """``retry_s``: the first and the longest pause between reset retries."""
        self.backend, self.retry_s = backend, retry_s
        self._on_fault, self._on_recovered = on_fault, on_recovered
        self.gpus = {g.uuid: ManagedGpu(g, deadline_s, backend.blocking) for g in backend.gpus()}
        self._retries: set[asyncio.Task[None]] = set()
        self._retrying: set[str] = set()
        self._stopping = False

    def gpu(self, uuid: str) -> ManagedGpu:
        try:
            return self.gpus[uuid]
        except KeyError:
            raise UnknownGpu(f"no GPU with UUID {uuid[:80]!r} on this node (GPUs are addressed by UUID)") from None

    def healthy(self, uuid: str) -> ManagedGpu:
        gpu = self.gpu(uuid)
        if gpu.fault is not None:
            raise GpuUnhealthy(f"GPU {uuid} is unhealthy ({gpu.fault}); the daemon is retrying its reset")
        return gpu

    def faults(self) -> dict[str, str]:
        return {u: g.fault for u, g in self.gpus.items() if g.fault is not None}

    async def call(self, gpu: ManagedGpu, fn: Callable[..., T], *args: Any) -> T:
        """A driver call on the GPU's worker; past the deadline the GPU becomes unhealthy."""
        try:
            return await gpu.run(fn, *args)
        except GpuTimeout as exc:
            gpu.timeouts += 1
            self.fault(gpu, exc.message)
            raise

    def fault(self, gpu: ManagedGpu, why: str) -> None:
        """Mark the GPU unhealthy and retry its reset until it succeeds. Its clock is unknown until then."""
        if gpu.fault is None:
            log.error(event("gpu_unhealthy", gpu=gpu.uuid, why=why))
            audit.info(event("gpu_unhealthy", gpu=gpu.uuid, why=why))
        gpu.fault, gpu.locked_mhz = why, None
        self._on_fault(gpu)
        if gpu.uuid not in self._retrying and not self._stopping:
            self._retrying.add(gpu.uuid)
            self._spawn(self._retry_reset(gpu))

    async def stop(self) -> None:
        """Cancel the retries in flight, and start no more."""
        self._stopping = True
        for task in list(self._retries):
            task.cancel()
        await asyncio.gather(*self._retries, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _retry_reset(self, gpu: ManagedGpu) -> None:
        pause, longest = self.retry_s
        try:
            while gpu.fault is not None:
                await asyncio.sleep(pause)
                try:
                    await asyncio.shield(gpu.serial(lambda: self._recover(gpu)))
                except ClockError as exc:
                    pause = min(2 * pause, longest)
                    log.warning(event("reset_retry_failed", gpu=gpu.uuid, error=exc.message, next_s=pause))
        finally:
            self._retrying.discard(gpu.uuid)

    async def _recover(self, gpu: ManagedGpu) -> None:
        """One retried reset, on the serial path: queued behind a stuck call, if one runs."""
        if gpu.fault is None:
            return
        try:
            await gpu.run(self.backend.reset, gpu.uuid)
        except GpuTimeout:
            gpu.timeouts += 1
            raise
        gpu.fault = None
        audit.info(event("gpu_recovered", gpu=gpu.uuid))
        await self._on_recovered(gpu)

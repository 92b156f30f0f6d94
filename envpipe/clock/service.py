"""The daemon's core, free of HTTP: allow-list, snapping, leases, ownership, one serial worker per GPU
with deadlines, GPU health and reset retries, the leased-clock state, metrics and the audit log. The
HTTP layer (daemon.py) only parses requests into calls on this."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from envpipe.clock.backends import Backend, GpuStatic
from envpipe.clock.errors import (
    ClockError,
    GpuTimeout,
    GpuUnhealthy,
    Held,
    NotOwned,
    OutOfRange,
    StateUnwritable,
    UnknownGpu,
    UnknownLease,
)
from envpipe.clock.identity import Peer
from envpipe.clock.leases import MAX_TTL_S, MIN_TTL_S, Lease, LeaseTable
from envpipe.clock.metrics import DaemonMetrics
from envpipe.clock.ownership import OwnershipPolicy, PodRef
from envpipe.clock.state import Entry, StateFile
from envpipe.clock.workers import SerialWorker

audit = logging.getLogger("envpipe.clockd.audit")
log = logging.getLogger("envpipe.clockd")
T = TypeVar("T")


@dataclass(frozen=True)
class ServiceConfig:
    min_mhz: int = 0  # allow-list range; 0 and a huge max mean "whatever the GPU supports"
    max_mhz: int = 1_000_000
    default_ttl_s: float = 5.0
    reap_interval_s: float = 0.2
    driver_deadline_s: float = 3.0  # a driver call that takes longer marks its GPU unhealthy
    retry_s: tuple[float, float] = (0.5, 30.0)  # first and longest pause between reset retries


class ManagedGpu:
    """One GPU as the daemon runs it: its serial worker, the clock the daemon set, its health."""

    def __init__(self, static: GpuStatic, deadline_s: float, blocking: bool) -> None:
        self.static = static
        self.uuid = static.uuid
        self.locked_mhz: int | None = None  # what the daemon locked; None: default (or unknown after a fault)
        self.fault: str | None = None  # why the GPU is unhealthy; None while healthy
        self.current_mhz: int | None = None  # the last reading, answered while the GPU is unhealthy
        self.energy_mj: int | None = None
        # A backend whose calls cannot block (sim) runs inline: in order anyway on the one loop thread.
        self.worker = SerialWorker(f"GPU {self.uuid}", deadline_s) if blocking else None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args) if self.worker is None else await self.worker.call(fn, *args)


class ClockService:
    def __init__(
        self,
        backend: Backend,
        policy: OwnershipPolicy,
        config: ServiceConfig,
        state: StateFile | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if config.min_mhz > config.max_mhz:
            raise ClockError(f"allow-list is empty: min {config.min_mhz} MHz > max {config.max_mhz} MHz")
        self.backend, self.policy, self.config, self.state = backend, policy, config, state
        self.leases = LeaseTable(clock)
        self._gpus = {g.uuid: ManagedGpu(g, config.driver_deadline_s, backend.blocking) for g in backend.gpus()}
        self.metrics = DaemonMetrics(backend.name, policy.name)
        for uuid in self._gpus:
            self.metrics.healthy.labels(gpu=uuid).set(1)
        # GPUs that may be off their default clock: the state file's content, kept in memory too.
        self._dirty: dict[str, Entry] = {}
        self._state_writer = SerialWorker("state file", config.driver_deadline_s) if state else None
        self._tasks: set[asyncio.Task[Any]] = set()  # lease ends and reset retries in flight
        self._retrying: set[str] = set()
        self.started = False
        self._stopping = False

    def gpu_uuids(self) -> list[str]:
        return list(self._gpus)

    def locked(self) -> dict[str, int]:
        """The SM clock the daemon locked, per GPU that it locked (what the audit log says it set)."""
        return {u: g.locked_mhz for u, g in self._gpus.items() if g.locked_mhz is not None}

    # ---- health -------------------------------------------------------------------------------
    def faults(self) -> dict[str, str]:
        return {u: g.fault for u, g in self._gpus.items() if g.fault is not None}

    @property
    def ready(self) -> bool:
        """Start-up resets done and every GPU healthy: every GPU is at default or held by a lease."""
        return self.started and not self.faults()

    def health(self) -> dict[str, Any]:
        faults = self.faults()
        status = "starting" if not self.started else "degraded" if faults else "ok"
        return {
            "ok": status == "ok",
            "status": status,
            "backend": self.backend.name,
            "ownership": self.policy.name,
            "gpus": len(self._gpus),
            "leases": len(self.leases),
            "unhealthy": faults,
        }

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _gpu(self, uuid: str) -> ManagedGpu:
        try:
            return self._gpus[uuid]
        except KeyError:
            raise UnknownGpu(f"no GPU with UUID {uuid!r} on this node (GPUs are addressed by UUID)") from None

    def _healthy(self, uuid: str) -> ManagedGpu:
        gpu = self._gpu(uuid)
        if gpu.fault is not None:
            raise GpuUnhealthy(f"GPU {uuid} is unhealthy ({gpu.fault}); the daemon is retrying its reset")
        return gpu

    async def _call(self, gpu: ManagedGpu, fn: Callable[..., T], *args: Any) -> T:
        """A driver call on the GPU's worker; past the deadline the GPU becomes unhealthy."""
        try:
            return await gpu.run(fn, *args)
        except GpuTimeout as exc:
            self.metrics.timeouts.labels(gpu=gpu.uuid).inc()
            self._fault(gpu, exc.message)
            raise

    def _fault(self, gpu: ManagedGpu, why: str) -> None:
        """Mark the GPU unhealthy, end its lease in the books (its other GPUs are reset) and retry the
        reset until it succeeds. Its clock is unknown until then."""
        if gpu.fault is None:
            log.error("GPU %s is unhealthy: %s", gpu.uuid, why)
            audit.info(json.dumps({"event": "gpu_unhealthy", "gpu": gpu.uuid, "why": why}))
        gpu.fault, gpu.locked_mhz = why, None
        self.metrics.healthy.labels(gpu=gpu.uuid).set(0)
        self.metrics.ready.set(0)
        holder = self.leases.holder(gpu.uuid)
        if holder is not None:
            self.end_lease_soon(holder, f"GPU {gpu.uuid} unhealthy")
        if gpu.uuid not in self._retrying and not self._stopping:
            self._retrying.add(gpu.uuid)
            self._spawn(self._retry_reset(gpu))

    async def _retry_reset(self, gpu: ManagedGpu) -> None:
        pause, longest = self.config.retry_s
        try:
            while gpu.fault is not None:
                await asyncio.sleep(pause)
                try:
                    await gpu.run(self.backend.reset, gpu.uuid)  # queued behind a stuck call, if one runs
                except ClockError as exc:
                    log.warning("GPU %s: reset retry failed (%s); next in %g s", gpu.uuid, exc, min(2 * pause, longest))
                    pause = min(2 * pause, longest)
                    continue
                gpu.fault = None
                self.metrics.healthy.labels(gpu=gpu.uuid).set(1)
                self.metrics.ready.set(int(self.ready))
                audit.info(json.dumps({"event": "gpu_recovered", "gpu": gpu.uuid}))
                self._audit_change(gpu.uuid, None, "reset retry")
                await self._clean(gpu.uuid)
        finally:
            self._retrying.discard(gpu.uuid)

    # ---- the leased-clock state ---------------------------------------------------------------
    async def _persist(self) -> None:
        if self.state is None or self._state_writer is None:
            return
        try:
            await self._state_writer.call(self.state.save, dict(self._dirty))
        except (OSError, GpuTimeout) as exc:
            raise StateUnwritable(f"cannot write the state file {self.state.path}: {exc}") from None

    async def _mark_dirty(self, uuid: str, lease: Lease) -> None:
        """Write ahead: the state file names the GPU before its clock first changes."""
        if uuid in self._dirty:
            return
        self._dirty[uuid] = Entry(lease.id[:8], lease.owner, time.time())
        try:
            await self._persist()
        except StateUnwritable:
            del self._dirty[uuid]
            raise

    async def _clean(self, uuid: str) -> None:
        if self._dirty.pop(uuid, None) is not None:
            try:
                await self._persist()
            except StateUnwritable as exc:  # stays named on disk: the next start resets it once more
                log.error("%s", exc.message)

    # ---- start and stop -----------------------------------------------------------------------
    async def start(self, previous: dict[str, Entry] | None, why: str = "daemon start") -> None:
        """Reset what a dead daemon may have left: the GPUs its state names, or, with no state to go by
        (first start, no --state-file, an unreadable file), every GPU. Then the daemon is ready."""
        if previous is None:
            todo: Iterable[str] = list(self._gpus)
        else:
            todo = [u for u in previous if u in self._gpus]
            for uuid in todo:
                left = previous[uuid]
                audit.info(
                    json.dumps(
                        {
                            "event": "left_by_dead_daemon",
                            "gpu": uuid,
                            "lease": left.lease,
                            "owner": left.owner,
                            "since": left.since,
                        }
                    )
                )
        unknown = Entry("unknown", why, time.time())  # no state to say who left it
        self._dirty = {u: previous[u] if previous else unknown for u in todo}
        await self._persist()  # a state file that cannot be written fails here, before any clock changes
        await self._reset_each(todo, why)
        self.started = True
        self.metrics.ready.set(int(self.ready))

    async def stop(self) -> None:
        """Forget every lease and reset every GPU the daemon may have changed (never waits past the
        deadline for a stuck GPU: it stays named in the state file for the next start)."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for lease in self.leases.all():
            self.leases.remove(lease.id)
        self.metrics.leases.set(0)
        await self._reset_each(list(self._dirty), "daemon shutdown", unhealthy_too=True)

    def close(self) -> None:
        stuck = [g.uuid for g in self._gpus.values() if g.worker is not None and g.worker.busy]
        for g in self._gpus.values():
            if g.worker is not None:
                g.worker.stop()
        if self._state_writer is not None:
            self._state_writer.stop()
        if stuck:  # shutting the driver down under a thread still inside it is asking for trouble
            log.warning("driver calls still running on %s at exit; not shutting the driver down", stuck)
        else:
            self.backend.close()

    # ---- GPUs -------------------------------------------------------------------------------
    async def gpu(self, uuid: str) -> dict[str, Any]:
        gpu = self._gpu(uuid)
        if gpu.fault is None:
            with contextlib.suppress(GpuTimeout):  # unhealthy now: answer the last reading
                gpu.current_mhz, gpu.energy_mj = await self._call(
                    gpu, lambda: (self.backend.current_mhz(uuid), self.backend.energy_mj(uuid))
                )
        return {
            "uuid": uuid,
            "name": gpu.static.name,
            "supported_mhz": list(gpu.static.supported_mhz),
            "current_mhz": gpu.current_mhz,
            "energy_mj": gpu.energy_mj,
            "locked": None if gpu.locked_mhz is None else {"min_mhz": gpu.locked_mhz, "max_mhz": gpu.locked_mhz},
            "lease_held": self.leases.holder(uuid) is not None,
            "healthy": gpu.fault is None,
        }

    async def gpus(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self.gpu(u) for u in self._gpus)))

    def snap(self, uuid: str, mhz: int) -> int:
        """Refuse outside the allow-list; otherwise snap to the nearest supported clock inside it."""
        cfg = self.config
        if not cfg.min_mhz <= mhz <= cfg.max_mhz:
            raise OutOfRange(f"{mhz} MHz is outside the allowed range [{cfg.min_mhz}, {cfg.max_mhz}] MHz")
        allowed = [c for c in self._gpu(uuid).static.supported_mhz if cfg.min_mhz <= c <= cfg.max_mhz]
        if not allowed:
            raise OutOfRange(f"GPU {uuid} supports no clock inside [{cfg.min_mhz}, {cfg.max_mhz}] MHz")
        return min(allowed, key=lambda c: (abs(c - mhz), -c))  # ties go to the faster clock

    # ---- leases -----------------------------------------------------------------------------
    async def open_lease(
        self, peer: Peer, pod: PodRef | None, gpus: list[str], ttl_s: float | None, claimed: str | None = None
    ) -> Lease:
        """``pod`` is checked by the ownership policy; ``claimed`` (the X-Envpipe-Pod header) only
        names the caller in the audit log when the body names no pod."""
        for g in gpus:
            self._healthy(g)
        ttl = self.config.default_ttl_s if ttl_s is None else ttl_s
        if not MIN_TTL_S <= ttl <= MAX_TTL_S:
            raise OutOfRange(f"ttl_s {ttl} is outside [{MIN_TTL_S}, {MAX_TTL_S}] s")
        # The kubelet call blocks: off the loop. The lease table is only touched on the loop.
        await asyncio.to_thread(self.policy.check, peer, pod, gpus)
        for g in gpus:
            self._healthy(g)  # again: a GPU may have failed during the check
        owner = peer.describe() + (f" pod={pod}" if pod else f" claims pod={claimed}" if claimed else "")
        lease = self.leases.open(gpus, ttl, owner)
        self.metrics.leases.set(len(self.leases))
        event = {"event": "lease_open", "lease": lease.id[:8], "gpus": list(lease.gpus), "ttl_s": ttl}
        audit.info(json.dumps({**event, "owner": owner}))
        return lease

    def _forget(self, lease_id: str, why: str) -> Lease | None:
        """End the lease in the books (at once, never waiting on a GPU); None if already gone."""
        lease = self.leases.remove(lease_id)
        if lease is not None:
            self.metrics.leases.set(len(self.leases))
            audit.info(json.dumps({"event": "lease_end", "lease": lease.id[:8], "why": why, "owner": lease.owner}))
        return lease

    async def end_lease(self, lease_id: str, why: str) -> bool:
        """Reset the lease's GPUs and forget it; False if it was already gone."""
        lease = self._forget(lease_id, why)
        if lease is None:
            return False
        await self._reset_each(lease.gpus, f"lease {lease.id[:8]} {why}")
        return True

    def end_lease_soon(self, lease_id: str, why: str) -> None:
        lease = self._forget(lease_id, why)
        if lease is not None:
            self._spawn(self._reset_each(lease.gpus, f"lease {lease.id[:8]} {why}"))

    def _held(self, uuid: str, lease_id: str) -> Lease:
        self._gpu(uuid)
        lease = self.leases.get(lease_id)
        if uuid not in lease.gpus:
            holder = self.leases.holder(uuid)
            if holder is not None:
                raise Held(f"GPU {uuid} is held by another lease")
            raise NotOwned(f"lease {lease_id[:8]} does not hold GPU {uuid}; open a lease on it first")
        return lease

    # ---- clocks -----------------------------------------------------------------------------
    async def lock(self, uuid: str, lease_id: str, mhz: int) -> dict[str, Any]:
        try:
            lease = self._held(uuid, lease_id)
            gpu = self._healthy(uuid)
            applied = self.snap(uuid, mhz)
            if gpu.locked_mhz != applied:  # repeating the same clock costs no driver call
                await self._mark_dirty(uuid, lease)
                if self.leases.holder(uuid) != lease.id:  # ended while the state was written
                    raise UnknownLease(f"lease {lease.id[:8]} ended while locking {uuid}")
                await self._call(gpu, self.backend.lock, uuid, applied)
                if self.leases.holder(uuid) != lease.id:  # the lease ended meanwhile: its reset follows
                    raise UnknownLease(f"lease {lease.id[:8]} ended while locking {uuid}; the GPU is reset")
                gpu.locked_mhz = applied
                self._audit_change(uuid, applied, f"lease {lease.id[:8]} ({lease.owner})")
        except ClockError as exc:
            self.metrics.locks.labels(outcome=exc.code).inc()
            raise
        self.metrics.locks.labels(outcome="ok").inc()
        return {
            "uuid": uuid,
            "requested_mhz": mhz,
            "applied_mhz": applied,
            "applied": self.backend.applies_writes,
        }

    async def reset(self, uuid: str, lease_id: str) -> None:
        lease = self._held(uuid, lease_id)
        self._healthy(uuid)
        await self._reset(uuid, f"lease {lease.id[:8]} ({lease.owner})")

    async def _reset(self, uuid: str, why: str) -> None:
        """Reset one GPU; a failure (error or deadline) makes it unhealthy and starts the retries."""
        gpu = self._gpus[uuid]
        try:
            await self._call(gpu, self.backend.reset, uuid)
        except GpuTimeout:
            raise
        except ClockError as exc:
            self._fault(gpu, f"reset failed: {exc.message}")
            raise
        gpu.locked_mhz = None
        self._audit_change(uuid, None, why)
        await self._clean(uuid)

    async def _reset_each(self, gpus: Iterable[str], why: str, unhealthy_too: bool = False) -> None:
        """Reset GPUs concurrently; one failing GPU neither stops the others nor goes unreported.
        Unhealthy GPUs are left to their retries, except at the last try on the way out."""
        todo = [u for u in gpus if unhealthy_too or self._gpus[u].fault is None]
        results = await asyncio.gather(*(self._reset(u, why) for u in todo), return_exceptions=True)
        for uuid, res in zip(todo, results, strict=True):
            if isinstance(res, BaseException):
                log.error("could not reset GPU %s (%s): %s", uuid, why, res)

    def _audit_change(self, uuid: str, mhz: int | None, why: str) -> None:
        if not audit.isEnabledFor(logging.INFO):
            return  # no JSON encoding on the hot path when nobody reads it
        audit.info(
            json.dumps(
                {
                    "event": "clock_lock" if mhz else "clock_reset",
                    "gpu": uuid,
                    "mhz": mhz,
                    "applied": self.backend.applies_writes,
                    "by": why,
                }
            )
        )

    async def reap_forever(self) -> None:
        """End expired leases. Never waits on a GPU: their resets run as tasks of their own."""
        while True:
            for lease in self.leases.expired():
                self.end_lease_soon(lease.id, "expired")
            await asyncio.sleep(self.config.reap_interval_s)

    # ---- metrics ----------------------------------------------------------------------------
    async def refresh_metrics(self) -> None:
        for g in await self.gpus():
            if g["current_mhz"] is not None:
                self.metrics.sm_clock.labels(gpu=g["uuid"]).set(g["current_mhz"])
            if g["energy_mj"] is not None:
                self.metrics.energy.mj[g["uuid"]] = g["energy_mj"]

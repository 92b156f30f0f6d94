"""The daemon's core, free of HTTP: allow-list, snapping, locks and resets, metrics and the audit log of
clock changes. It composes the lease books (leases.py: expiry, ownership), the GPUs' health and reset
retries (health.py) and the leased-clock state file (recorded.py). The HTTP layer (api.py) parses requests
into calls on this and reaches nothing else.

Every change to a GPU (lock, reset, a retried reset) and to its line in the state file runs on that GPU's
serial path (gpus.py): one operation at a time, in the order asked, each to its end. So the state file
names every GPU whose clock the daemon moved off its default, a lock answers ``applied`` only once the GPU
has that clock, and a lease's reset finishes before the next lease's lock of the same GPU starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from envpipe.clock.backends import Backend
from envpipe.clock.errors import ClockError, GpuTimeout, OutOfRange, StateUnwritable
from envpipe.clock.gpus import ManagedGpu
from envpipe.clock.health import GpuHealth
from envpipe.clock.identity import Peer
from envpipe.clock.leases import Lease, Leases
from envpipe.clock.logs import audit, event, log
from envpipe.clock.metrics import DaemonMetrics, GpuSample
from envpipe.clock.ownership import OwnershipPolicy, PodRef
from envpipe.clock.recorded import Recorded
from envpipe.clock.state import Entry, StateFile

STATE_RETRY_S = 1.0  # after a failed write, how often the state file is written again


@dataclass(frozen=True)
class ServiceConfig:
    min_mhz: int = 0  # allow-list range; 0 and a huge max mean "whatever the GPU supports"
    max_mhz: int = 1_000_000
    default_ttl_s: float = 5.0
    reap_interval_s: float = 0.2
    driver_deadline_s: float = 3.0  # a driver call that takes longer marks its GPU unhealthy
    retry_s: tuple[float, float] = (0.5, 30.0)  # first and longest pause between reset retries


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
        self._leases = Leases(policy, config.default_ttl_s, clock)
        self._health = GpuHealth(backend, config.driver_deadline_s, config.retry_s, self._faulted, self._recovered)
        self._gpus = self._health.gpus
        self.metrics = DaemonMetrics(backend.name, policy.name, self._samples)
        self._recorded = Recorded(state, config.driver_deadline_s, self._note_state)
        self.started = False

    def gpu_uuids(self) -> list[str]:
        return list(self._gpus)

    def locked(self) -> dict[str, int]:
        """The SM clock the daemon locked, per GPU that it locked (what the audit log says it set)."""
        return {u: g.locked_mhz for u, g in self._gpus.items() if g.locked_mhz is not None}

    def recorded(self) -> set[str]:
        """The GPUs the state file names (as last written, or being written)."""
        return self._recorded.gpus()

    @property
    def state_error(self) -> str | None:
        """Why the last write of the state file failed; None while it is written."""
        return self._recorded.error

    # ---- health -------------------------------------------------------------------------------
    def faults(self) -> dict[str, str]:
        return self._health.faults()

    def not_ready(self) -> str | None:
        """Why /readyz is not 200, or None: start-up resets done, every GPU healthy (at default or held by
        a lease), and the state file written (a lock could outlive a crash unrecorded otherwise)."""
        faults = self.faults()
        if not self.started:
            return "start-up resets still running"
        if faults:
            return f"unhealthy GPU(s): {faults}"
        if self.state_error is not None:
            return f"the state file cannot be written: {self.state_error}"
        return None

    @property
    def ready(self) -> bool:
        return self.not_ready() is None

    def _note_ready(self) -> None:
        self.metrics.ready.set(int(self.ready))

    def _note_state(self) -> None:
        self.metrics.state_writable.set(int(self.state_error is None))
        self._note_ready()

    def health(self) -> dict[str, Any]:
        faults = self.faults()
        degraded = faults or self.state_error is not None
        status = "starting" if not self.started else "degraded" if degraded else "ok"
        return {
            "ok": status == "ok",
            "status": status,
            "backend": self.backend.name,
            "ownership": self.policy.name,
            "gpus": len(self._gpus),
            "leases": len(self._leases),
            "unhealthy": faults,
            "state_writable": self.state_error is None,
        }

    def _samples(self) -> list[GpuSample]:
        samples = []
        for g in self._gpus.values():
            lease = self._leases.holder(g.uuid)
            pod, container = (lease.pod, lease.containers.get(g.uuid, "")) if lease else (None, "")
            samples.append(GpuSample(g.static, g.current_mhz, g.energy_mj, g.fault is None, g.timeouts, pod, container))
        return samples

    def _faulted(self, gpu: ManagedGpu) -> None:
        """A GPU became unhealthy: end its lease in the books (its other GPUs are reset). The state file
        keeps naming it until a retried reset succeeds."""
        self._note_ready()
        holder = self._leases.holder(gpu.uuid)
        if holder is not None:
            self.end_lease_soon(holder.id, f"GPU {gpu.uuid} unhealthy")

    async def _recovered(self, gpu: ManagedGpu) -> None:
        self._audit_change(gpu.uuid, None, "reset retry")
        await self._recorded.drop(gpu.uuid)
        self._note_ready()

    # ---- start and stop -----------------------------------------------------------------------
    async def start(self, previous: dict[str, Entry] | None, why: str = "daemon start") -> None:
        """Reset what a dead daemon may have left: the GPUs its state names, or, with no state to go by
        (first start, no --state-file, an unreadable file), every GPU. Then the daemon is ready, unless the
        state file cannot be written: the resets happen all the same (a GPU left slow must not wait for a disk),
        and the daemon runs unready, refusing every lock, until a write succeeds."""
        if previous is None:
            todo: Iterable[str] = list(self._gpus)
        else:
            todo = [u for u in previous if u in self._gpus]
            for uuid in todo:
                left = previous[uuid]
                audit.info(event("left_by_dead_daemon", gpu=uuid, lease=left.lease, owner=left.owner, since=left.since))
        unknown = Entry("unknown", why, time.time())  # no state to say who left it
        with contextlib.suppress(StateUnwritable):  # logged once, and /readyz says so (Recorded.error)
            await self._recorded.start({u: previous[u] if previous else unknown for u in todo})
        await self._reset_each(todo, why)
        self.started = True
        self._note_ready()

    async def stop(self) -> None:
        """Forget every lease and reset every GPU the daemon may have changed (never waits past the
        deadline for a stuck GPU: it stays named in the state file for the next start)."""
        await self._health.stop()
        for lease in self._leases.all():
            self._forget(lease.id, "daemon shutdown")
        await self.idle()
        await self._reset_each(self._recorded.gpus(), "daemon shutdown", unhealthy_too=True)

    async def idle(self) -> None:
        """Wait until every operation queued on a GPU so far has ended."""
        await asyncio.gather(*(g.idle() for g in self._gpus.values()))

    def close(self) -> None:
        stuck = [g.uuid for g in self._gpus.values() if g.worker is not None and g.worker.busy]
        for g in self._gpus.values():
            if g.worker is not None:
                g.worker.stop()
        self._recorded.stop()
        if stuck:  # shutting the driver down under a thread still inside it is asking for trouble
            log.warning(event("driver_busy_at_exit", gpus=stuck))
        else:
            self.backend.close()

    # ---- GPUs -------------------------------------------------------------------------------
    async def _read(self, gpu: ManagedGpu) -> None:
        """Read the GPU's clock and energy counter (unhealthy: keep the last reading)."""
        if gpu.fault is not None:
            return
        uuid = gpu.uuid

        def clock_and_energy() -> tuple[int, int | None]:
            return self.backend.current_mhz(uuid), self.backend.energy_mj(uuid)

        with contextlib.suppress(GpuTimeout):
            gpu.current_mhz, gpu.energy_mj = await self._health.call(gpu, clock_and_energy)
            holder = self._leases.holder(uuid)
            if holder is not None and gpu.energy_mj is not None:
                self.metrics.lease_energy.update(holder.id, uuid, gpu.energy_mj)

    async def gpu(self, uuid: str) -> dict[str, Any]:
        gpu = self._health.gpu(uuid)
        await self._read(gpu)
        return {
            "uuid": uuid,
            "index": gpu.static.index,
            "name": gpu.static.name,
            "supported_mhz": list(gpu.static.supported_mhz),
            "current_mhz": gpu.current_mhz,
            "energy_mj": gpu.energy_mj,
            "locked": None if gpu.locked_mhz is None else {"min_mhz": gpu.locked_mhz, "max_mhz": gpu.locked_mhz},
            "lease_held": self._leases.holder(uuid) is not None,
            "healthy": gpu.fault is None,
        }

    async def gpus(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self.gpu(u) for u in self._gpus)))

    def snap(self, uuid: str, mhz: int) -> int:
        """Refuse outside the allow-list; otherwise snap to the nearest supported clock inside it."""
        cfg = self.config
        if not cfg.min_mhz <= mhz <= cfg.max_mhz:
            raise OutOfRange(f"{mhz} MHz is outside the allowed range [{cfg.min_mhz}, {cfg.max_mhz}] MHz")
        allowed = [c for c in self._health.gpu(uuid).static.supported_mhz if cfg.min_mhz <= c <= cfg.max_mhz]
        if not allowed:
            raise OutOfRange(f"GPU {uuid} supports no clock inside [{cfg.min_mhz}, {cfg.max_mhz}] MHz")
        return min(allowed, key=lambda c: (abs(c - mhz), -c))  # ties go to the faster clock

    # ---- leases -----------------------------------------------------------------------------
    async def open_lease(
        self, peer: Peer, pod: PodRef | None, gpus: list[str], ttl_s: float | None, claimed: str | None = None
    ) -> dict[str, object]:
        """``pod`` is checked by the ownership policy; ``claimed`` (the X-Envpipe-Pod header) only
        names the caller in the audit log when the body names no pod."""
        for g in gpus:
            self._health.healthy(g)
        ttl = self._leases.ttl(ttl_s)
        containers = await self._leases.owned(peer, pod, gpus)
        for g in gpus:
            self._health.healthy(g)  # again: a GPU may have failed during the check
        owner = peer.describe() + (f" pod={pod}" if pod else f" claims pod={claimed}" if claimed else "")
        lease = self._leases.open(gpus, ttl, owner, pod, containers)
        self.metrics.leases.set(len(self._leases))
        for uuid in lease.gpus:  # where the lease's energy counter starts
            gpu = self._gpus[uuid]
            with contextlib.suppress(ClockError):
                await self._read(gpu)
            if gpu.energy_mj is not None:
                self.metrics.lease_energy.start(lease, gpu.static, gpu.energy_mj)
        return lease.to_json(self._leases.now())

    def lease_exists(self, lease_id: str) -> bool:
        return self._leases.find(lease_id) is not None

    def renew(self, lease_id: str) -> dict[str, object]:
        return self._leases.renew(lease_id).to_json(self._leases.now())

    async def close_lease(self, lease_id: str) -> None:
        self._leases.get(lease_id)  # UnknownLease (404) if it is gone
        await self.end_lease(lease_id, "closed by client")

    def attach(self, lease_id: str) -> None:
        """Take the lease's one attach stream; ``detach`` gives it back."""
        self._leases.attach(lease_id)

    def detach(self, lease_id: str) -> None:
        self._leases.detach(lease_id)

    def attached_count(self) -> int:
        return self._leases.attached_count()

    def _forget(self, lease_id: str, why: str) -> Lease | None:
        """End the lease in the books (at once, never waiting on a GPU); None if already gone."""
        lease = self._leases.end(lease_id, why)
        if lease is not None:
            self.metrics.leases.set(len(self._leases))
        return lease

    def _release(self, lease: Lease, why: str) -> list[asyncio.Task[None]]:
        """Queue the reset of each of the lease's GPUs behind whatever runs on it now."""
        gpus = [self._gpus[u] for u in lease.gpus]
        return [g.serial(functools.partial(self._release_op, g, lease, why)) for g in gpus]

    async def end_lease(self, lease_id: str, why: str) -> bool:
        """Reset the lease's GPUs and forget it; False if it was already gone."""
        lease = self._forget(lease_id, why)
        if lease is None:
            return False
        await asyncio.shield(asyncio.gather(*self._release(lease, why)))
        return True

    def end_lease_soon(self, lease_id: str, why: str) -> None:
        lease = self._forget(lease_id, why)
        if lease is not None:
            self._release(lease, why)

    def _held(self, uuid: str, lease_id: str) -> Lease:
        self._health.gpu(uuid)  # UnknownGpu first
        return self._leases.held(uuid, lease_id)

    # ---- clocks: the operations on a GPU's serial path ------------------------------------------
    async def lock(self, uuid: str, lease_id: str, mhz: int) -> dict[str, Any]:
        try:
            lease = self._held(uuid, lease_id)
            gpu = self._health.healthy(uuid)
            applied = self.snap(uuid, mhz)
            await asyncio.shield(gpu.serial(lambda: self._lock_op(gpu, lease, applied)))
        except ClockError as exc:
            self.metrics.locks.labels(outcome=exc.code).inc()
            raise
        self.metrics.locks.labels(outcome="ok").inc()
        return {"uuid": uuid, "requested_mhz": mhz, "applied_mhz": applied, "applied": self.backend.applies_writes}

    async def _lock_op(self, gpu: ManagedGpu, lease: Lease, mhz: int) -> None:
        self._leases.still_held(gpu.uuid, lease)
        self._health.healthy(gpu.uuid)
        if gpu.locked_mhz == mhz:  # the GPU has it: no driver call
            return
        await self._recorded.name(gpu.uuid, lease.short, lease.owner)
        try:
            await self._health.call(gpu, self.backend.lock, gpu.uuid, mhz)
        except ClockError:
            if gpu.locked_mhz is None and gpu.fault is None:  # refused: still at default, so not recorded
                await self._recorded.drop(gpu.uuid)
            raise
        gpu.locked_mhz = mhz
        self._audit_change(gpu.uuid, mhz, f"lease {lease.short} ({lease.owner})")
        self._leases.still_held(gpu.uuid, lease)  # ended during the call: its reset is queued behind this

    async def reset(self, uuid: str, lease_id: str) -> None:
        lease = self._held(uuid, lease_id)
        gpu = self._health.healthy(uuid)

        async def reset_held() -> None:
            self._leases.still_held(uuid, lease)
            await self._reset_op(gpu, f"lease {lease.short} ({lease.owner})")

        await asyncio.shield(gpu.serial(reset_held))

    async def _reset_op(self, gpu: ManagedGpu, why: str, unhealthy_too: bool = False) -> None:
        """Reset one GPU; a failure (error or deadline) makes it unhealthy and starts the retries.
        Unhealthy GPUs are left to their retries, but for the last try on the way out."""
        if gpu.fault is not None and not unhealthy_too:
            return
        try:
            await self._health.call(gpu, self.backend.reset, gpu.uuid)
        except GpuTimeout:
            raise
        except ClockError as exc:
            self._health.fault(gpu, f"reset failed: {exc.message}")
            raise
        gpu.locked_mhz = None
        self._audit_change(gpu.uuid, None, why)
        await self._recorded.drop(gpu.uuid)

    async def _release_op(self, gpu: ManagedGpu, lease: Lease, why: str) -> None:
        """A lease's end on one GPU: its last energy reading, then the reset."""
        with contextlib.suppress(ClockError):
            await self._read(gpu)
        if gpu.energy_mj is not None:
            self.metrics.lease_energy.update(lease.id, gpu.uuid, gpu.energy_mj)
        self.metrics.lease_energy.end(lease.id, gpu.uuid)
        try:
            await self._reset_op(gpu, f"lease {lease.short} {why}")
        except ClockError as exc:
            log.error(event("reset_failed", gpu=gpu.uuid, why=f"lease {lease.short} {why}", error=exc.message))

    async def _reset_each(self, uuids: Iterable[str], why: str, unhealthy_too: bool = False) -> None:
        """Reset GPUs concurrently; one failing GPU neither stops the others nor goes unreported."""
        todo = list(uuids)
        gpus = [self._gpus[u] for u in todo]
        tasks = [g.serial(functools.partial(self._reset_op, g, why, unhealthy_too)) for g in gpus]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for uuid, res in zip(todo, results, strict=True):
            if isinstance(res, BaseException):
                log.error(event("reset_failed", gpu=uuid, why=why, error=str(res)))

    def _audit_change(self, uuid: str, mhz: int | None, why: str) -> None:
        if not audit.isEnabledFor(logging.INFO):
            return  # no JSON encoding on the hot path when nobody reads it
        kind = "clock_lock" if mhz else "clock_reset"
        audit.info(event(kind, gpu=uuid, mhz=mhz, applied=self.backend.applies_writes, by=why))

    async def reap_forever(self) -> None:
        """End expired leases, and write the state file again while its last write failed. Never waits
        on a GPU: resets run on the GPUs' serial paths."""
        next_state_try = 0.0
        while True:
            for lease in self._leases.expired():
                self.end_lease_soon(lease.id, "expired")
            now = time.monotonic()
            if self.state_error is not None and now >= next_state_try:
                next_state_try = now + STATE_RETRY_S
                with contextlib.suppress(StateUnwritable):
                    await self._recorded.write()
            await asyncio.sleep(self.config.reap_interval_s)

    async def refresh_metrics(self) -> None:
        """Read every healthy GPU for a scrape (clocks, energy: the leases' energy counters too)."""
        await asyncio.gather(*(self._read(g) for g in self._gpus.values()), return_exceptions=True)
        self.metrics.attached.set(self.attached_count())

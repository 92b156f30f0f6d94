"""The daemon's core, free of HTTP: allow-list, snapping, leases, ownership, serial GPU workers,
metrics and the audit log. The HTTP layer (daemon.py) only parses requests into calls on this."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from envpipe.clock.backends import Backend, GpuStatic
from envpipe.clock.errors import ClockError, Held, NotOwned, OutOfRange, UnknownGpu, UnknownLease
from envpipe.clock.leases import MAX_TTL_S, MIN_TTL_S, Lease, LeaseTable
from envpipe.clock.ownership import OwnershipPolicy, Peer, PodRef

audit = logging.getLogger("envpipe.clockd.audit")
log = logging.getLogger("envpipe.clockd")
T = TypeVar("T")


@dataclass(frozen=True)
class ServiceConfig:
    min_mhz: int = 0  # allow-list range; 0 and a huge max mean "whatever the GPU supports"
    max_mhz: int = 1_000_000
    default_ttl_s: float = 5.0
    reap_interval_s: float = 0.2


class ClockService:
    def __init__(
        self,
        backend: Backend,
        policy: OwnershipPolicy,
        config: ServiceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if config.min_mhz > config.max_mhz:
            raise ClockError(f"allow-list is empty: min {config.min_mhz} MHz > max {config.max_mhz} MHz")
        self.backend, self.policy, self.config = backend, policy, config
        self.leases = LeaseTable(clock)
        self._static: dict[str, GpuStatic] = {g.uuid: g for g in backend.gpus()}
        self._locked: dict[str, int] = {}  # uuid -> locked SM clock, as the daemon set it
        # One serial worker per GPU: commands to a GPU are applied in the order they arrive.
        self._workers = {u: ThreadPoolExecutor(1, thread_name_prefix=f"gpu-{u[:12]}") for u in self._static}
        self.registry = CollectorRegistry()
        self.m_clock = Gauge(
            "envpipe_clockd_sm_clock_mhz", "Current SM clock", ["gpu"], registry=self.registry
        )
        self.m_energy = Gauge(
            "envpipe_clockd_energy_mj", "GPU energy counter (mJ)", ["gpu"], registry=self.registry
        )
        self.m_locks = Counter(
            "envpipe_clockd_lock_requests", "Lock requests by outcome", ["outcome"], registry=self.registry
        )
        self.m_leases = Gauge("envpipe_clockd_leases", "Open leases", registry=self.registry)

    # ---- GPUs -------------------------------------------------------------------------------
    def _gpu(self, uuid: str) -> GpuStatic:
        try:
            return self._static[uuid]
        except KeyError:
            raise UnknownGpu(f"no GPU with UUID {uuid!r} on this node (GPUs are addressed by UUID)") from None

    async def _on_gpu(self, uuid: str, fn: Callable[..., T], *args: Any) -> T:
        if not self.backend.blocking:  # in order anyway: the event loop is one thread
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._workers[uuid], fn, *args)

    async def gpu(self, uuid: str) -> dict[str, Any]:
        static = self._gpu(uuid)
        current, energy = await self._on_gpu(
            uuid, lambda: (self.backend.current_mhz(uuid), self.backend.energy_mj(uuid))
        )
        locked = self._locked.get(uuid)
        return {
            "uuid": uuid,
            "name": static.name,
            "supported_mhz": list(static.supported_mhz),
            "current_mhz": current,
            "energy_mj": energy,
            "locked": None if locked is None else {"min_mhz": locked, "max_mhz": locked},
            "lease_held": self.leases.holder(uuid) is not None,
        }

    async def gpus(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self.gpu(u) for u in self._static)))

    def snap(self, uuid: str, mhz: int) -> int:
        """Refuse outside the allow-list; otherwise snap to the nearest supported clock inside it."""
        cfg = self.config
        if not cfg.min_mhz <= mhz <= cfg.max_mhz:
            raise OutOfRange(f"{mhz} MHz is outside the allowed range [{cfg.min_mhz}, {cfg.max_mhz}] MHz")
        allowed = [c for c in self._gpu(uuid).supported_mhz if cfg.min_mhz <= c <= cfg.max_mhz]
        if not allowed:
            raise OutOfRange(f"GPU {uuid} supports no clock inside [{cfg.min_mhz}, {cfg.max_mhz}] MHz")
        return min(allowed, key=lambda c: (abs(c - mhz), -c))  # ties go to the faster clock

    # ---- leases -----------------------------------------------------------------------------
    async def open_lease(self, peer: Peer, pod: PodRef | None, gpus: list[str], ttl_s: float | None) -> Lease:
        for g in gpus:
            self._gpu(g)
        ttl = self.config.default_ttl_s if ttl_s is None else ttl_s
        if not MIN_TTL_S <= ttl <= MAX_TTL_S:
            raise OutOfRange(f"ttl_s {ttl} is outside [{MIN_TTL_S}, {MAX_TTL_S}] s")
        # The kubelet call blocks: off the loop. The lease table is only touched on the loop.
        await asyncio.to_thread(self.policy.check, peer, pod, gpus)
        owner = peer.describe() + (f" pod={pod}" if pod else "")
        lease = self.leases.open(gpus, ttl, owner)
        self.m_leases.set(len(self.leases))
        event = {"event": "lease_open", "lease": lease.id[:8], "gpus": list(lease.gpus), "ttl_s": ttl}
        audit.info(json.dumps({**event, "owner": owner}))
        return lease

    async def end_lease(self, lease_id: str, why: str) -> bool:
        """Reset the lease's GPUs and forget it; False if it was already gone."""
        lease = self.leases.remove(lease_id)
        if lease is None:
            return False
        self.m_leases.set(len(self.leases))
        audit.info(
            json.dumps({"event": "lease_end", "lease": lease.id[:8], "why": why, "owner": lease.owner})
        )
        await self._reset_each(lease.gpus, f"lease {lease.id[:8]} {why}")
        return True

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
            applied = self.snap(uuid, mhz)
            if self._locked.get(uuid) != applied:  # repeating the same clock costs no driver call
                await self._on_gpu(uuid, self.backend.lock, uuid, applied)
                if self.leases.holder(uuid) != lease.id:  # the lease ended meanwhile: its reset follows
                    raise UnknownLease(f"lease {lease.id[:8]} ended while locking {uuid}; the GPU is reset")
                self._locked[uuid] = applied
                self._audit_change(uuid, applied, f"lease {lease.id[:8]} ({lease.owner})")
        except ClockError as exc:
            self.m_locks.labels(outcome=exc.code).inc()
            raise
        self.m_locks.labels(outcome="ok").inc()
        return {
            "uuid": uuid,
            "requested_mhz": mhz,
            "applied_mhz": applied,
            "applied": self.backend.applies_writes,
        }

    async def reset(self, uuid: str, lease_id: str) -> None:
        lease = self._held(uuid, lease_id)
        await self._reset(uuid, f"lease {lease.id[:8]} ({lease.owner})")

    async def _reset(self, uuid: str, why: str) -> None:
        await self._on_gpu(uuid, self.backend.reset, uuid)
        self._locked.pop(uuid, None)
        self._audit_change(uuid, None, why)

    async def reset_all(self, why: str) -> None:
        """Reset every managed GPU; at start-up and shutdown, so no restart leaves a GPU slow."""
        for lease in self.leases.all():
            self.leases.remove(lease.id)
        self.m_leases.set(0)
        await self._reset_each(tuple(self._static), why)

    async def _reset_each(self, gpus: tuple[str, ...], why: str) -> None:
        """Reset GPUs concurrently; one failing GPU neither stops the others nor goes unreported."""
        results = await asyncio.gather(*(self._reset(u, why) for u in gpus), return_exceptions=True)
        for uuid, res in zip(gpus, results, strict=True):
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
        while True:
            for lease in self.leases.expired():
                await self.end_lease(lease.id, "expired")
            await asyncio.sleep(self.config.reap_interval_s)

    # ---- metrics ----------------------------------------------------------------------------
    async def refresh_metrics(self) -> None:
        for g in await self.gpus():
            self.m_clock.labels(gpu=g["uuid"]).set(g["current_mhz"])
            if g["energy_mj"] is not None:
                self.m_energy.labels(gpu=g["uuid"]).set(g["energy_mj"])

    def close(self) -> None:
        for w in self._workers.values():
            w.shutdown(wait=True)
        self.backend.close()

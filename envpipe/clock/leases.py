"""Leases: every lock belongs to one; a lease holds GPUs exclusively until closed or expired, and only GPUs
its caller's pod was given (the ownership policy)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from envpipe.clock.errors import AlreadyAttached, Held, NotOwned, OutOfRange, UnknownLease
from envpipe.clock.identity import Peer
from envpipe.clock.logs import audit, event
from envpipe.clock.ownership import OwnershipPolicy, PodRef

MIN_TTL_S = 0.5
MAX_TTL_S = 300.0


@dataclass
class Lease:
    id: str
    gpus: tuple[str, ...]
    ttl_s: float
    expires: float
    owner: str  # peer and pod, for the audit log
    pod: PodRef | None = None  # as the lease request named it (checked by the kubelet policy)
    containers: Mapping[str, str] = field(default_factory=dict)  # gpu uuid -> container, where the policy knows
    attached: bool = False  # an attach stream is open (one per lease)

    @property
    def short(self) -> str:
        """The lease in logs and metrics: a prefix, never the whole secret."""
        return self.id[:8]

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "lease": self.id,
            "gpus": list(self.gpus),
            "ttl_s": self.ttl_s,
            "expires_in_s": round(max(0.0, self.expires - now), 3),
        }


class Leases:
    """The lease books: which lease holds which GPU until when, whether the caller's pod may have the GPUs
    (the ownership policy), and each lease's one attach stream. Nothing here touches a GPU."""

    def __init__(
        self, policy: OwnershipPolicy, default_ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy
        self.default_ttl_s = default_ttl_s
        self._now = clock
        self._leases: dict[str, Lease] = {}
        self._holder: dict[str, str] = {}  # gpu uuid -> lease id

    def __len__(self) -> int:
        return len(self._leases)

    def now(self) -> float:
        return self._now()

    def ttl(self, ttl_s: float | None) -> float:
        """The lease's time to live: the default when the request names none; OutOfRange outside the bounds."""
        ttl = self.default_ttl_s if ttl_s is None else ttl_s
        if not MIN_TTL_S <= ttl <= MAX_TTL_S:
            raise OutOfRange(f"ttl_s {ttl:g} is outside [{MIN_TTL_S}, {MAX_TTL_S}] s")
        return ttl

    async def owned(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> dict[str, str]:
        """The ownership policy's check (NotOwned), off the loop: the kubelet call blocks. The table is
        only touched on the loop."""
        return await asyncio.to_thread(self.policy.check, peer, pod, gpus)

    def open(
        self,
        gpus: list[str],
        ttl_s: float,
        owner: str,
        pod: PodRef | None = None,
        containers: Mapping[str, str] | None = None,
    ) -> Lease:
        held = [g for g in gpus if g in self._holder]
        if held:
            raise Held(f"GPU(s) {', '.join(held)} are held by another lease; wait for it to end or expire")
        lease = Lease(
            secrets.token_hex(16), tuple(dict.fromkeys(gpus)), ttl_s, self._now() + ttl_s, owner, pod, containers or {}
        )
        self._leases[lease.id] = lease
        for g in lease.gpus:
            self._holder[g] = lease.id
        audit.info(event("lease_open", lease=lease.short, gpus=list(lease.gpus), ttl_s=ttl_s, owner=owner))
        return lease

    def get(self, lease_id: str) -> Lease:
        try:
            return self._leases[lease_id]
        except KeyError:
            raise UnknownLease(f"no lease {lease_id[:40]!r} (it expired, was closed, or never existed)") from None

    def find(self, lease_id: str) -> Lease | None:
        return self._leases.get(lease_id)

    def renew(self, lease_id: str) -> Lease:
        lease = self.get(lease_id)
        lease.expires = self._now() + lease.ttl_s
        return lease

    def end(self, lease_id: str, why: str) -> Lease | None:
        """End the lease in the books (at once, never waiting on a GPU); None if already gone."""
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            for g in lease.gpus:
                self._holder.pop(g, None)
            audit.info(event("lease_end", lease=lease.short, why=why, owner=lease.owner))
        return lease

    def holder(self, gpu: str) -> Lease | None:
        lease_id = self._holder.get(gpu)
        return None if lease_id is None else self._leases[lease_id]

    def held(self, gpu: str, lease_id: str) -> Lease:
        """The lease, if it holds the GPU: Held if another lease does, NotOwned if none does."""
        lease = self.get(lease_id)
        if gpu not in lease.gpus:
            if self.holder(gpu) is not None:
                raise Held(f"GPU {gpu} is held by another lease")
            raise NotOwned(f"lease {lease.short} does not hold GPU {gpu}; open a lease on it first")
        return lease

    def still_held(self, gpu: str, lease: Lease) -> None:
        """UnknownLease if the lease ended after a request on the GPU was queued."""
        if self.holder(gpu) is not lease:
            raise UnknownLease(f"lease {lease.short} ended before this request ran on {gpu}; the GPU is reset")

    def expired(self) -> list[Lease]:
        now = self._now()
        return [lease for lease in self._leases.values() if lease.expires <= now]

    def all(self) -> list[Lease]:
        return list(self._leases.values())

    def attach(self, lease_id: str) -> None:
        """Take the lease's one attach stream; ``detach`` gives it back."""
        lease = self.get(lease_id)
        if lease.attached:
            raise AlreadyAttached(f"lease {lease.short} already has its attach stream; one per lease")
        lease.attached = True

    def detach(self, lease_id: str) -> None:
        lease = self.find(lease_id)
        if lease is not None:
            lease.attached = False

    def attached_count(self) -> int:
        return sum(lease.attached for lease in self._leases.values())

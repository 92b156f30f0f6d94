"""Leases: every lock belongs to one; a lease holds GPUs exclusively until closed or expired."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from envpipe.clock.errors import Held, UnknownLease
from envpipe.clock.ownership import PodRef

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


class LeaseTable:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._now = clock
        self._leases: dict[str, Lease] = {}
        self._holder: dict[str, str] = {}  # gpu uuid -> lease id

    def __len__(self) -> int:
        return len(self._leases)

    def now(self) -> float:
        return self._now()

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

    def remove(self, lease_id: str) -> Lease | None:
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            for g in lease.gpus:
                self._holder.pop(g, None)
        return lease

    def holder(self, gpu: str) -> Lease | None:
        lease_id = self._holder.get(gpu)
        return None if lease_id is None else self._leases[lease_id]

    def expired(self) -> list[Lease]:
        now = self._now()
        return [lease for lease in self._leases.values() if lease.expires <= now]

    def all(self) -> list[Lease]:
        return list(self._leases.values())

"""What each caller may ask of the daemon at once and per second: the answer to a flood is a 429 to the
caller that floods, while every other caller is served.

A caller (``caller_key``) is the lease a request names, when that lease exists: the lease id is a secret,
so nobody can spend another's lease budget, and a trainer's renewals and locks are counted apart from any
neighbour. A request that names no lease (or a lease that does not exist) is counted on the lease its
connection already served, else per peer as the kernel names it (identity.Peer.key). What a caller claims
(``X-Envpipe-Pod``) never picks its budget: rotating claimed names would buy a fresh one each time.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator

from envpipe.clock.errors import TooManyRequests


def lease_key(lease_id: str) -> str:
    return f"lease:{lease_id[:8]}"


class RateLimiter:
    """Token bucket per caller: ``rate`` requests a second, bursts of ``burst``."""

    MAX_KEYS = 10_000

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def take(self, key: str) -> bool:
        now = time.monotonic()
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if len(self._buckets) >= self.MAX_KEYS:  # forget the longest-quiet caller, not everyone
            self._buckets.popitem(last=False)
        ok = tokens >= 1
        self._buckets[key] = (tokens - 1 if ok else tokens, now)
        return ok


class InFlight:
    """Requests being served at once, per caller and in all (an attach stream is not counted here: there
    is one per lease at most)."""

    def __init__(self, per_caller: int, total: int) -> None:
        self.per_caller, self.total = per_caller, total
        self._by_caller: collections.Counter[str] = collections.Counter()
        self.count = 0

    @contextlib.contextmanager
    def admit(self, key: str) -> Iterator[None]:
        if self._by_caller[key] >= self.per_caller:
            raise TooManyRequests(f"{self.per_caller} requests of this caller are being served already; wait for them")
        if self.count >= self.total:
            raise TooManyRequests(f"the daemon is serving {self.total} requests; try again shortly")
        self._by_caller[key] += 1
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            self._by_caller[key] -= 1
            if not self._by_caller[key]:
                del self._by_caller[key]

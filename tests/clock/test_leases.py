"""The lease books alone, on a fake clock: expiry, renewal, who holds a GPU, ownership, the attach stream."""

from __future__ import annotations

import asyncio

import pytest

from envpipe.clock.errors import AlreadyAttached, Held, NotOwned, OutOfRange, UnknownLease
from envpipe.clock.identity import Peer
from envpipe.clock.leases import MAX_TTL_S, Leases
from envpipe.clock.ownership import LocalPolicy, PodRef


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class OnlyGpuA:
    name = "only-a"

    def check(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> dict[str, str]:
        if gpus != ["A"]:
            raise NotOwned("the pod was given A only")
        return {"A": "trainer"}


def test_a_lease_expires_its_ttl_after_its_last_renewal() -> None:
    clock = FakeClock()
    leases = Leases(LocalPolicy(), default_ttl_s=5.0, clock=clock)
    lease = leases.open(["A", "B"], leases.ttl(None), "pid=1")
    clock.t += 4.0
    assert leases.renew(lease.id).to_json(leases.now())["expires_in_s"] == 5.0
    clock.t += 4.9
    assert leases.expired() == []
    clock.t += 0.1
    assert leases.expired() == [lease]


def test_a_gpu_has_one_holder_until_its_lease_ends() -> None:
    leases = Leases(LocalPolicy(), default_ttl_s=5.0, clock=FakeClock())
    first = leases.open(["A"], 5.0, "pid=1")
    with pytest.raises(Held):
        leases.open(["B", "A"], 5.0, "pid=2")
    second = leases.open(["B"], 5.0, "pid=2")
    assert leases.held("A", first.id) is first
    with pytest.raises(Held):
        leases.held("A", second.id)
    with pytest.raises(NotOwned):
        leases.held("C", second.id)
    assert leases.end(first.id, "closed") is first and leases.end(first.id, "closed") is None
    with pytest.raises(UnknownLease):
        leases.still_held("A", first)
    assert leases.holder("A") is None and len(leases) == 1
    assert leases.open(["A"], 5.0, "pid=3").gpus == ("A",)


def test_ttl_bounds_and_the_ownership_policy() -> None:
    leases = Leases(OnlyGpuA(), default_ttl_s=5.0, clock=FakeClock())
    assert leases.ttl(None) == 5.0 and leases.ttl(MAX_TTL_S) == MAX_TTL_S
    for bad in (0.1, MAX_TTL_S + 1):
        with pytest.raises(OutOfRange):
            leases.ttl(bad)
    assert asyncio.run(leases.owned(Peer(pid=1), PodRef("ns", "job"), ["A"])) == {"A": "trainer"}
    with pytest.raises(NotOwned):
        asyncio.run(leases.owned(Peer(pid=1), PodRef("ns", "job"), ["A", "B"]))


def test_one_attach_stream_per_lease() -> None:
    leases = Leases(LocalPolicy(), default_ttl_s=5.0, clock=FakeClock())
    lease = leases.open(["A"], 5.0, "pid=1")
    leases.attach(lease.id)
    with pytest.raises(AlreadyAttached):
        leases.attach(lease.id)
    assert leases.attached_count() == 1
    leases.detach(lease.id)
    leases.attach(lease.id)
    leases.end(lease.id, "closed")
    leases.detach(lease.id)  # a stream that outlives its lease gives nothing back
    assert leases.attached_count() == 0
    with pytest.raises(UnknownLease):
        leases.attach(lease.id)

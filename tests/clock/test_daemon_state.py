"""What the daemon records is what the GPUs have: locks, resets and lease ends of one GPU run one at a time
on its serial path, so the state file names exactly the GPUs off their default clock whenever no operation
runs, whatever interleaves (a lease ending while the next one locks, a daemon killed and restarted), and a
lock answers `applied` only once the GPU has that clock. A state file that is a FIFO, or that stops being
writable, is refused or reported (readyz), never a hang.

The GPUs are benchmarks/clockd_study/fake_pynvml.py backed by a store file: their clocks outlive a daemon, as real
ones outlive their driver client. Its calls take a few milliseconds here, so that operations overlap.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml
from benchmarks.clockd_study.harness import call, daemon_argv
from envpipe.clock.backends import NvmlBackend
from envpipe.clock.errors import ClockError
from envpipe.clock.identity import Peer
from envpipe.clock.ownership import LocalPolicy
from envpipe.clock.service import ClockService, ServiceConfig
from envpipe.clock.state import StateError, StateFile
from tests.support.clockd_helpers import ROOT, daemon_thread, wait_for

UUIDS = [f"GPU-{c * 8}-0000-0000-0000-00000000000{i}" for i, c in enumerate("abc")]
MAX = 1980  # the fake's default SM clock
CLOCKS = (1005, 1200, 1500)
SLOW = {"nvmlDeviceResetGpuLockedClocks": 0.004, "nvmlDeviceSetGpuLockedClocks": 0.002}


def recorded(state: str) -> set[str]:
    with open(state) as f:
        return set(json.load(f)["gpus"])


def off_default(store: str) -> dict[str, int]:
    return {g.uuid: g.sm_mhz for g in FakeNvml.from_store(store).gpus if g.sm_mhz != MAX}


# ---- the property: steps of concurrent operations, kills and restarts ---------------------------------
gpu_index = st.integers(0, len(UUIDS) - 1)
operation = st.one_of(
    st.tuples(st.just("open"), gpu_index),
    st.tuples(st.just("lock"), gpu_index, st.sampled_from(CLOCKS)),
    st.tuples(st.just("reset"), gpu_index),
    st.tuples(st.just("end"), gpu_index),  # what expiry, a closed attach stream or the owner's exit do
    st.tuples(st.just("close"), gpu_index),
    st.tuples(st.just("handover"), gpu_index, st.sampled_from(CLOCKS)),  # end, open anew and lock at once
)
step = st.one_of(
    st.lists(operation, min_size=1, max_size=4),  # run concurrently
    st.just("kill"),  # SIGKILL: nothing is reset, the state file stays
    st.just("restart"),  # SIGTERM and a new daemon
)


class Node:
    """One node: fake GPUs in a store file, a state file, and the daemon of the moment (in process)."""

    def __init__(self, where: str) -> None:
        self.store, self.state_path = f"{where}/gpus.json", f"{where}/state.json"
        FakeNvml([FakeGpu(u, hang=dict(SLOW)) for u in UUIDS], store=self.store)
        self.leases: dict[int, str] = {}  # GPU index -> the lease the "client" holds on it
        self.service: ClockService | None = None
        self.state: StateFile | None = None

    async def start(self) -> None:
        self.state = StateFile(self.state_path)
        previous = self.state.open()
        backend = NvmlBackend(FakeNvml.from_store(self.store))
        self.service = ClockService(backend, LocalPolicy(), ServiceConfig(driver_deadline_s=5.0), self.state)
        await self.service.start(previous)
        self.leases = {}

    def kill(self) -> None:
        assert self.service is not None and self.state is not None
        self.service.close()  # its threads end; nothing is reset
        self.state.close()

    async def restart(self) -> None:
        assert self.service is not None and self.state is not None
        await self.service.stop()
        self.service.close()
        self.state.close()
        await self.start()

    async def run(self, op: tuple, alone: bool) -> None:
        """``alone``: no other operation of this step touches the GPU (so its clock can be read after)."""
        svc, kind, i = self.service, op[0], op[1]
        assert svc is not None
        uuid, lease = UUIDS[i], self.leases.get(i, "no-such-lease")
        try:
            if kind == "open":
                self.leases[i] = str((await svc.open_lease(Peer(pid=1), None, [uuid], 60.0))["lease"])
            elif kind == "lock":
                answer = await svc.lock(uuid, lease, op[2])
                if alone:  # applied: the GPU has the clock when the answer is given
                    assert FakeNvml.from_store(self.store).gpus[i].sm_mhz == answer["applied_mhz"]
            elif kind == "reset":
                await svc.reset(uuid, lease)
            elif kind == "end":
                svc.end_lease_soon(lease, "expired")
            elif kind == "close":
                await svc.close_lease(lease)
            elif kind == "handover":
                svc.end_lease_soon(lease, "expired")
                self.leases[i] = lease = str((await svc.open_lease(Peer(pid=2), None, [uuid], 60.0))["lease"])
                await svc.lock(uuid, lease, op[2])
        except ClockError:
            pass  # refusals (a lease that ended meanwhile, a GPU held by another) are answers, not faults

    def check(self) -> None:
        """The state file names exactly the GPUs off their default clock, and the daemon knows their clocks."""
        assert self.service is not None
        off = off_default(self.store)
        assert recorded(self.state_path) == set(off), (recorded(self.state_path), off)
        assert self.service.locked() == off


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(step, min_size=1, max_size=8))
def test_the_state_file_names_exactly_the_gpus_off_their_default_clock(steps) -> None:
    async def play(node: Node) -> None:
        await node.start()
        for s in steps:
            if s == "kill":
                node.kill()
                assert set(off_default(node.store)) <= recorded(node.state_path)  # what the next start resets
                await node.start()
            elif s == "restart":
                await node.restart()
            else:
                touched = [op[1] for op in s]
                await asyncio.gather(*(node.run(op, touched.count(op[1]) == 1) for op in s))
                assert node.service is not None
                await node.service.idle()
            node.check()
        await node.restart()
        assert off_default(node.store) == {} and recorded(node.state_path) == set()
        assert node.service is not None
        node.service.close()
        assert node.state is not None
        node.state.close()

    with tempfile.TemporaryDirectory() as where:
        asyncio.run(play(Node(where)))


# ---- the scenarios of the attack, over a real socket ---------------------------------------------------
def test_a_lock_while_the_previous_lease_is_still_being_reset_is_recorded(tmp_path) -> None:
    """Lease A ends (its reset takes 0.3 s); lease B opens the GPU and locks it meanwhile. The lock waits
    for A's reset, the state file names the GPU, and a clean stop resets it."""
    store, state, sock = str(tmp_path / "gpus.json"), str(tmp_path / "state.json"), str(tmp_path / "c.sock")
    fake = FakeNvml([FakeGpu(UUIDS[0])], store=store)
    with daemon_thread(sock, backend=NvmlBackend(fake), state=StateFile(state)):
        a = call(sock, "POST", "/v1/leases", {"gpus": [UUIDS[0]], "ttl_s": 30})[1]["lease"]
        assert call(sock, "POST", f"/v1/gpus/{UUIDS[0]}/lock", {"lease": a, "mhz": 1005})[0] == 200
        fake.update(UUIDS[0], hang={"nvmlDeviceResetGpuLockedClocks": 0.3})
        closing = threading.Thread(target=call, args=(sock, "DELETE", f"/v1/leases/{a}"))
        closing.start()
        b = wait_for_lease(sock, UUIDS[0])
        status, answer = call(sock, "POST", f"/v1/gpus/{UUIDS[0]}/lock", {"lease": b, "mhz": 1200})
        closing.join()
        assert status == 200 and answer["applied"] is True
        assert fake.refresh()[0].sm_mhz == 1200 and recorded(state) == {UUIDS[0]}
        assert [c[0] for c in fake.gpus[0].calls[-2:]] == ["reset", "lock"]  # A's reset, then B's lock
    assert fake.refresh()[0].sm_mhz == MAX and recorded(state) == set()  # the stop reset it


def wait_for_lease(sock: str, uuid: str) -> str:
    """A lease on ``uuid`` as soon as the previous one is gone from the books."""
    found: list[str] = []

    def opened() -> bool:
        status, body = call(sock, "POST", "/v1/leases", {"gpus": [uuid], "ttl_s": 30})
        if status == 201:
            found.append(body["lease"])
        return bool(found)

    wait_for(opened, 5.0)
    return found[0]


def test_relocking_the_same_clock_during_a_reset_locks_it_again(tmp_path) -> None:
    """The lease's own reset is running when it asks for the clock it had: the answer comes once the GPU
    has that clock again, never while it sits at default."""
    store, sock = str(tmp_path / "gpus.json"), str(tmp_path / "c.sock")
    fake = FakeNvml([FakeGpu(UUIDS[0])], store=store)
    with daemon_thread(sock, backend=NvmlBackend(fake)):
        lease = call(sock, "POST", "/v1/leases", {"gpus": [UUIDS[0]], "ttl_s": 30})[1]["lease"]
        lock = {"lease": lease, "mhz": 1200}
        assert call(sock, "POST", f"/v1/gpus/{UUIDS[0]}/lock", lock)[0] == 200
        fake.update(UUIDS[0], hang={"nvmlDeviceResetGpuLockedClocks": 0.3})
        resetting = threading.Thread(target=call, args=(sock, "POST", f"/v1/gpus/{UUIDS[0]}/reset", {"lease": lease}))
        resetting.start()
        time.sleep(0.05)  # the reset runs now
        status, answer = call(sock, "POST", f"/v1/gpus/{UUIDS[0]}/lock", lock)
        assert status == 200 and answer["applied"] is True and fake.refresh()[0].sm_mhz == 1200
        resetting.join()
        assert call(sock, "GET", f"/v1/gpus/{UUIDS[0]}")[1]["locked"] == {"min_mhz": 1200, "max_mhz": 1200}


def test_a_fifo_as_the_state_file_is_refused_at_once(tmp_path) -> None:
    state = tmp_path / "state.json"
    os.mkfifo(state)
    t0 = time.monotonic()
    done = subprocess.run(
        daemon_argv(str(tmp_path / "c.sock"), "--state-file", str(state)),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=30,
    )
    assert time.monotonic() - t0 < 15  # a blocking open never returns: the timeout would fire
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "not a regular file" in lines[0], done.stderr
    assert not (tmp_path / "c.sock").exists() and not (tmp_path / "state.json.lock").exists()


def test_a_state_file_that_cannot_be_written_makes_the_daemon_unready_until_it_can(tmp_path) -> None:
    state, sock = tmp_path / "state.json", str(tmp_path / "c.sock")
    with daemon_thread(sock, state=StateFile(str(state))):
        gpu = call(sock, "GET", "/v1/gpus")[1]["gpus"][0]["uuid"]
        lease = call(sock, "POST", "/v1/leases", {"gpus": [gpu], "ttl_s": 30})[1]["lease"]
        (tmp_path / "state.json.tmp").mkdir()  # every write fails now (even as root)
        status, body = call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1005})
        assert status == 503 and body["error"] == "state_unwritable"
        assert call(sock, "GET", f"/v1/gpus/{gpu}")[1]["locked"] is None  # refused before the clock changed
        status, body = call(sock, "GET", "/readyz")
        assert status == 503 and "state file" in body["message"]
        assert call(sock, "GET", "/healthz")[1]["state_writable"] is False
        (tmp_path / "state.json.tmp").rmdir()
        wait_for(lambda: call(sock, "GET", "/readyz")[0] == 200, 5.0)  # written again within a second
        assert call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1005})[0] == 200
        assert recorded(str(state)) == {gpu}


def test_a_state_file_unwritable_at_start_still_resets_and_the_daemon_runs_unready(tmp_path) -> None:
    """A full or broken disk at start (after a crash): the GPUs are reset all the same, the daemon serves,
    unready and refusing locks, and becomes ready once the file can be written (not a crash loop that leaves
    GPUs slow)."""
    store, state, sock = str(tmp_path / "gpus.json"), tmp_path / "state.json", str(tmp_path / "c.sock")
    fake = FakeNvml([FakeGpu(UUIDS[0], sm_mhz=1005)], store=store)  # left slow by a daemon that died
    (tmp_path / "state.json.tmp").mkdir()  # every write fails (even as root)
    with daemon_thread(sock, backend=NvmlBackend(fake), state=StateFile(str(state))):
        assert fake.refresh()[0].sm_mhz == MAX  # no state to go by: every GPU reset
        status, body = call(sock, "GET", "/readyz")
        assert status == 503 and "state file" in body["message"]
        lease = call(sock, "POST", "/v1/leases", {"gpus": [UUIDS[0]], "ttl_s": 30})[1]["lease"]
        assert call(sock, "POST", f"/v1/gpus/{UUIDS[0]}/lock", {"lease": lease, "mhz": 1005})[0] == 503
        (tmp_path / "state.json.tmp").rmdir()
        wait_for(lambda: call(sock, "GET", "/readyz")[0] == 200, 5.0)
        assert call(sock, "POST", f"/v1/gpus/{UUIDS[0]}/lock", {"lease": lease, "mhz": 1005})[0] == 200


@pytest.mark.parametrize("what", ["directory", "fifo"])
def test_a_lock_file_that_is_not_a_file_is_refused(tmp_path, what) -> None:
    lock = tmp_path / "state.json.lock"
    lock.mkdir() if what == "directory" else os.mkfifo(lock)
    with pytest.raises(StateError, match=r"not a regular file|cannot write"):
        StateFile(str(tmp_path / "state.json")).open()
    assert Path(lock).exists()  # not ours to remove

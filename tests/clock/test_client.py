"""The client against real daemons: leases, non-blocking set, crashes on either side, races."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.clockd_study.harness import call, daemon_process
from envpipe.clock.client import ClockClient, ClockDaemonUnavailable, ClockRequestError
from envpipe.clock.service import ServiceConfig
from tests.support.clockd_helpers import ROOT, daemon_thread, wait_for
from tests.support.scheduling import bound_s


def first_gpu(sock: str) -> str:
    return call(sock, "GET", "/v1/gpus")[1]["gpus"][0]["uuid"]


def locked(sock: str, gpu: str):
    return call(sock, "GET", f"/v1/gpus/{gpu}")[1]["locked"]


def test_absent_daemon_is_reported(tmp_path, monkeypatch) -> None:
    with pytest.raises(ClockDaemonUnavailable, match="no envpipe-clockd socket"):
        ClockClient(str(tmp_path / "none.sock"), gpu_uuids=["GPU-x"])
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # a socket file nobody listens on
    monkeypatch.setenv("ENVPIPE_CLOCKD_SOCKET", str(stale))
    with pytest.raises(ClockDaemonUnavailable, match="does not answer"):
        ClockClient(gpu_uuids=["GPU-x"])


def test_set_is_non_blocking_latest_wins_and_close_resets(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock, config=ServiceConfig(min_mhz=900)) as service:
        gpu = first_gpu(sock)
        with ClockClient(sock, gpu_uuids=[gpu], ttl_s=2.0) as client:
            calls: list[int] = []
            finished: list[int] = []  # locks the daemon got through
            original, hold = service.backend.lock, threading.Event()
            service.backend.lock = lambda u, m: (  # type: ignore
                calls.append(m), hold.wait(30), original(u, m), finished.append(m))
            for mhz in (1000, 1100, 1200, 1300):
                client.set(gpu, mhz)  # a set() that waited for the daemon would wait here (30 s) for `hold`
            assert finished == []  # all four returned while the daemon's first lock was still held up
            hold.set()
            client.flush()
            assert client.applied[gpu] == 1305 and locked(sock, gpu) == {"min_mhz": 1305, "max_mhz": 1305}
            assert calls[-1] == 1305 and len(calls) < 4  # superseded requests were dropped
            assert next(g["uuid"] for g in client.gpus()) == gpu
            e0 = client.energy_mj(gpu)
            time.sleep(0.05)
            assert client.energy_mj(gpu) > e0
            client.set(gpu, 5)  # refused by the allow-list: reported, not raised in the training thread
            client.flush()
            assert isinstance(client.last_error, ClockRequestError) and client.last_error.status == 422
        assert locked(sock, gpu) is None and service.health()["leases"] == 0
        with pytest.raises(RuntimeError, match="closed"):
            client.set(gpu, 1000)


def test_heartbeats_keep_a_short_lease_alive(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock, config=ServiceConfig(reap_interval_s=0.05)) as service:
        gpu = first_gpu(sock)
        ttl = bound_s(0.6)  # a TTL this process's scheduling delay cannot eat (tests.support.scheduling)
        with ClockClient(sock, gpu_uuids=[gpu], ttl_s=ttl) as client:
            client.set(gpu, 1000)
            client.flush()
            time.sleep(2.5 * ttl)  # more than two TTLs
            assert locked(sock, gpu) is not None and service.health()["leases"] == 1


def test_two_clients_race_for_one_gpu(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock):
        gpu = first_gpu(sock)
        results: list[object] = []
        barrier = threading.Barrier(2)

        def grab() -> None:
            barrier.wait()
            try:
                results.append(ClockClient(sock, gpu_uuids=[gpu]))
            except ClockRequestError as exc:
                results.append(exc)

        threads = [threading.Thread(target=grab) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [r for r in results if isinstance(r, ClockClient)]
        losers = [r for r in results if isinstance(r, ClockRequestError)]
        assert len(winners) == 1 and len(losers) == 1 and losers[0].status == 409
        winners[0].close()
        ClockClient(sock, gpu_uuids=[gpu]).close()  # free again once the winner is done


CLIENT = """
import sys, time
from envpipe.clock import ClockClient
c = ClockClient(sys.argv[1], gpu_uuids=[sys.argv[2]], ttl_s=float(sys.argv[3]))
c.lock_now(sys.argv[2], 1000)
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_client_killed_with_sigkill_resets_within_ttl(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    daemon = daemon_process(sock)
    try:
        gpu = first_gpu(sock)
        ttl = 3.0
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, sock, gpu, str(ttl)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert client.stdout is not None and client.stdout.readline().strip() == "locked"
        assert locked(sock, gpu) == {"min_mhz": 1005, "max_mhz": 1005}
        client.send_signal(signal.SIGKILL)
        client.communicate()
        waited = wait_for(lambda: locked(sock, gpu) is None, ttl + 2)
        assert waited < ttl  # the attach connection closing resets at once, well inside the TTL
    finally:
        daemon.terminate()
        daemon.communicate(timeout=10)


def test_the_client_reattaches_after_a_daemon_restart_and_counts_the_time_without_control(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock):
        gpu = first_gpu(sock)
        client = ClockClient(sock, gpu_uuids=[gpu], ttl_s=2.0)
        client.set(gpu, 1200)
        client.flush()
        assert client.controlled and client.uncontrolled_s() == 0 and client.reattaches == 0
    # the daemon stopped (its GPUs reset): the attach stream ended, so the client knows at once
    wait_for(lambda: not client.controlled, 5)
    time.sleep(0.3)
    assert client.uncontrolled_s() >= 0.3
    with daemon_thread(sock) as second:
        wait_for(lambda: client.controlled, 10)
        assert client.reattaches == 1 and second.health()["leases"] == 1
        assert locked(sock, gpu) == {"min_mhz": 1200, "max_mhz": 1200}  # the clock asked for, locked again
        gap = client.uncontrolled_s()
        time.sleep(0.1)
        assert client.uncontrolled_s() == gap < 10  # the count stopped at the re-lock
        client.set(gpu, 1305)  # and the new lease serves the next request
        client.flush()
        assert locked(sock, gpu) == {"min_mhz": 1305, "max_mhz": 1305}
        client.close()
        assert second.health()["leases"] == 0 and client.uncontrolled_s() == gap


@pytest.mark.slow
def test_daemon_killed_and_restarted(tmp_path) -> None:
    """SIGKILL leaves a stale socket and the GPU locked; the restarted daemon resets it first thing, and
    the client opens a new lease and locks the GPU again."""
    sock = str(tmp_path / "c.sock")
    daemon = daemon_process(sock)
    gpu = first_gpu(sock)
    client = ClockClient(sock, gpu_uuids=[gpu], ttl_s=1.0)
    client.lock_now(gpu, 1000)
    daemon.send_signal(signal.SIGKILL)
    daemon.communicate()
    assert os.path.exists(sock)  # a SIGKILLed daemon leaves its socket file behind
    wait_for(lambda: not client.controlled, 5)
    client.set(gpu, 1100)  # asked for while no daemon answers: kept for the next lease
    daemon = daemon_process(sock)  # replaces the stale socket and resets every GPU at start
    try:
        wait_for(lambda: client.controlled, 10)
        assert client.reattaches == 1 and locked(sock, gpu) == {"min_mhz": 1095, "max_mhz": 1095}
        assert client.uncontrolled_s() > 0
        client.close()
        again = ClockClient(sock, gpu_uuids=[gpu])
        assert again.lock_now(gpu, 1100)["applied_mhz"] == 1095
    finally:
        daemon.send_signal(signal.SIGTERM)  # with a GPU still locked: the daemon resets it on the way out
        out, _ = daemon.communicate(timeout=10)
    assert daemon.returncode == 0 and '"by": "daemon shutdown"' in out and not os.path.exists(sock)
    again.close()


def test_second_daemon_on_a_live_socket_refuses_to_start(tmp_path) -> None:
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock):
        proc = subprocess.run(
            [sys.executable, "-m", "envpipe.clock.daemon", "--backend", "sim", "--ownership", "local", "--socket",
             sock],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
            timeout=30,
        )
        assert proc.returncode != 0 and "already listening" in proc.stderr
        assert call(sock, "GET", "/healthz")[0] == 200

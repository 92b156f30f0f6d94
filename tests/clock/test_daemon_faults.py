"""Faults: a stuck or failing driver call on one GPU, a daemon killed and restarted, a second daemon on
a live socket, uninstall with a dead daemon. The nvml backend runs on benchmarks/clockd_study/fake_pynvml.py (hangs,
failures, and a store that outlives a daemon process, as a GPU's clocks outlive its driver client)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml
from benchmarks.clockd_study.harness import call, daemon_argv, daemon_process
from envpipe.clock.backends import NvmlBackend
from envpipe.clock.client import ClockClient
from envpipe.clock.service import ServiceConfig
from tests.support.clockd_helpers import ROOT, daemon_thread, one_metric, wait_for
from tests.support.scheduling import bound_s

A, B, C = (f"GPU-{c * 8}-0000-0000-0000-00000000000{i}" for i, c in enumerate("abc"))
MAX = 1980  # the fake's default (and highest) SM clock
FAST = ServiceConfig(reap_interval_s=0.05, driver_deadline_s=0.5)


def open_lease(sock: str, gpu: str, ttl_s: float = 30.0) -> str:
    status, body = call(sock, "POST", "/v1/leases", {"gpus": [gpu], "ttl_s": ttl_s})
    assert status == 201, body
    return str(body["lease"])


def lock(sock: str, gpu: str, lease: str, mhz: int) -> tuple[int, dict]:
    return call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": mhz})


def in_background(fn, *args) -> threading.Thread:
    """Run a request that may block (or fail) without holding up the test."""

    def run() -> None:
        with contextlib.suppress(OSError):  # a request stuck past the helper's socket timeout
            fn(*args)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_stuck_gpu_delays_no_other_gpus_lease_expiry(tmp_path) -> None:
    """GPU B's driver read hangs; B's lease expires first (its reset queues behind the hang). A's lease
    must still end on time, and listing must not wait for B."""
    a, b = FakeGpu(A), FakeGpu(B)
    fake = FakeNvml([a, b])
    sock = str(tmp_path / "c.sock")
    try:
        with daemon_thread(sock, backend=NvmlBackend(fake), config=FAST):
            lease_b, lease_a = open_lease(sock, B, ttl_s=0.6), open_lease(sock, A, ttl_s=1.5)
            assert lock(sock, B, lease_b, 1005)[0] == 200 and lock(sock, A, lease_a, 1005)[0] == 200
            a_expires = time.monotonic() + 1.5
            b.hang["nvmlDeviceGetClockInfo"] = 30.0
            in_background(call, sock, "GET", f"/v1/gpus/{B}")
            t0 = time.monotonic()
            status, listing = call(sock, "GET", "/v1/gpus")
            assert status == 200 and time.monotonic() - t0 < bound_s(2.0)  # by the deadline, not the 30 s hang
            health = {g["uuid"]: g["healthy"] for g in listing["gpus"]}
            assert health == {A: True, B: False}
            wait_for(lambda: a.sm_mhz == MAX, 6.0)
            assert time.monotonic() - a_expires < bound_s(1.0)  # before: only when B's 30 s hang ended
    finally:
        fake.release.set()


def test_a_driver_call_past_its_deadline_marks_the_gpu_unhealthy_ends_its_lease_and_retries(tmp_path) -> None:
    a, b = FakeGpu(A), FakeGpu(B)
    fake = FakeNvml([a, b])
    sock = str(tmp_path / "c.sock")
    try:
        with daemon_thread(sock, backend=NvmlBackend(fake), config=FAST):
            lease = open_lease(sock, B)
            b.hang["nvmlDeviceSetGpuLockedClocks"] = 30.0
            t0 = time.monotonic()
            status, body = lock(sock, B, lease, 1005)
            assert status == 504 and body["error"] == "gpu_timeout" and time.monotonic() - t0 < bound_s(2.0)
            assert call(sock, "POST", f"/v1/leases/{lease}/renew")[0] == 404  # ended in the daemon's books
            status, health = call(sock, "GET", "/healthz")
            assert status == 200 and health["status"] == "degraded" and B in health["unhealthy"]
            assert call(sock, "GET", "/readyz")[0] == 503
            assert one_metric(call(sock, "GET", "/metrics")[1], "envpipe_clockd_gpu_healthy", UUID=B) == 0
            status, body = call(sock, "POST", "/v1/leases", {"gpus": [B]})
            assert status == 503 and body["error"] == "gpu_unhealthy"
            assert lock(sock, A, open_lease(sock, A), 1200)[0] == 200  # the other GPU serves on
            b.hang.clear()
            fake.release.set()  # the stuck call returns; the retried reset follows it
            wait_for(lambda: call(sock, "GET", "/readyz")[0] == 200, 10.0)
            assert b.sm_mhz == MAX and b.calls[-1] == ("reset",)
            assert call(sock, "GET", "/healthz")[1]["status"] == "ok"
    finally:
        fake.release.set()


def test_the_daemon_stops_promptly_while_a_driver_call_hangs(tmp_path) -> None:
    b = FakeGpu(B)
    fake = FakeNvml([b])
    sock = str(tmp_path / "c.sock")
    try:
        with daemon_thread(sock, backend=NvmlBackend(fake), config=FAST):
            b.hang["nvmlDeviceGetClockInfo"] = 30.0
            in_background(call, sock, "GET", f"/v1/gpus/{B}")
            time.sleep(0.2)
            t0 = time.monotonic()
        assert time.monotonic() - t0 < bound_s(3.0)  # not the 30 s hang
    finally:
        fake.release.set()


def test_a_failed_start_up_reset_leaves_the_daemon_unready_until_a_retry_succeeds(tmp_path) -> None:
    a, b = FakeGpu(A), FakeGpu(B, sm_mhz=900, fail=["nvmlDeviceResetGpuLockedClocks"])
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock, backend=NvmlBackend(FakeNvml([a, b])), config=FAST):
        status, body = call(sock, "GET", "/readyz")
        assert status == 503 and B in body["message"]
        health = call(sock, "GET", "/healthz")[1]
        assert health["status"] == "degraded" and "nvmlDeviceResetGpuLockedClocks" in health["unhealthy"][B]
        assert call(sock, "POST", "/v1/leases", {"gpus": [B]})[0] == 503
        assert lock(sock, A, open_lease(sock, A), 1200)[0] == 200
        b.fail.clear()
        wait_for(lambda: call(sock, "GET", "/readyz")[0] == 200, 10.0)
        assert b.sm_mhz == MAX


def test_a_second_daemon_on_a_live_socket_touches_no_gpu(tmp_path) -> None:
    store, sock = str(tmp_path / "gpus.json"), str(tmp_path / "c.sock")
    fake = FakeNvml([FakeGpu(A), FakeGpu(B)], store=store)
    with daemon_thread(sock, backend=NvmlBackend(fake)):
        lease = open_lease(sock, A)
        assert lock(sock, A, lease, 1005)[0] == 200
        calls_before = {g.uuid: list(g.calls) for g in fake.refresh()}
        second = subprocess.run(
            daemon_argv(sock, "--state-file", str(tmp_path / "state.json"), nvml_store=store),
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
            timeout=60,
        )
        assert second.returncode != 0 and "already listening" in second.stderr
        assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
        gpus = {g.uuid: g for g in fake.refresh()}
        assert gpus[A].sm_mhz == 1005 and {u: g.calls for u, g in gpus.items()} == calls_before
        assert lock(sock, A, lease, 1005)[0] == 200  # the first daemon's cache and the GPU still agree
        assert fake.refresh()[0].sm_mhz == 1005


def test_a_second_daemon_on_another_socket_is_refused_before_it_touches_a_gpu(tmp_path) -> None:
    """The old daemon took `--state-file ''` with the nvml backend: a second one on another socket held no lock,
    found no state and reset every GPU behind the live daemon's lease. Now it needs the state file, whose lock
    the live daemon holds, whatever socket either serves."""
    store, sock, state = str(tmp_path / "gpus.json"), str(tmp_path / "c.sock"), str(tmp_path / "state.json")
    FakeNvml([FakeGpu(A), FakeGpu(B)], store=store)
    daemon = daemon_process(sock, "--state-file", state, nvml_store=store)
    try:
        lease = open_lease(sock, A)
        assert lock(sock, A, lease, 1005)[0] == 200
        before = {g.uuid: list(g.calls) for g in FakeNvml.from_store(store).gpus}
        env = {**os.environ, "PYTHONPATH": ROOT}
        for extra, message in (((), "--backend nvml needs --state-file"),
                               (("--state-file", state), "another envpipe-clockd holds")):
            second = subprocess.run(daemon_argv(str(tmp_path / "other.sock"), *extra, nvml_store=store),
                                    capture_output=True, text=True, env=env, timeout=60)
            lines = second.stderr.strip().splitlines()
            assert second.returncode != 0 and len(lines) == 1 and message in lines[0], second.stderr
            gpus = {g.uuid: g for g in FakeNvml.from_store(store).gpus}
            assert gpus[A].sm_mhz == 1005 and {u: g.calls for u, g in gpus.items()} == before
        assert not os.path.exists(tmp_path / "other.sock")
    finally:
        daemon.terminate()
        daemon.communicate(timeout=10)


def recorded(state: str) -> dict:
    """The GPUs the daemon's state file names."""
    with open(state) as f:
        return dict(json.load(f)["gpus"])


@pytest.mark.slow
def test_a_restart_after_sigkill_resets_the_leased_gpus_first_and_no_others(tmp_path) -> None:
    store, sock, state = str(tmp_path / "gpus.json"), str(tmp_path / "c.sock"), str(tmp_path / "state.json")
    FakeNvml([FakeGpu(A), FakeGpu(B), FakeGpu(C)], store=store)
    daemon = daemon_process(sock, "--state-file", state, nvml_store=store)
    try:
        FakeNvml.from_store(store).update(C, sm_mhz=1200)  # an operator's lock: not the daemon's to undo
        client = ClockClient(sock, gpu_uuids=[A], ttl_s=30)
        client.lock_now(A, 1005)
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.communicate()
    gpus = {g.uuid: g for g in FakeNvml.from_store(store).gpus}
    assert gpus[A].sm_mhz == 1005  # a dead daemon leaves the GPU slow
    assert recorded(state).keys() == {A}
    t0 = time.monotonic()
    daemon = daemon_process(sock, "--state-file", state, nvml_store=store)
    try:
        ready_after = time.monotonic() - t0
        gpus = {g.uuid: g for g in FakeNvml.from_store(store).gpus}
        assert gpus[A].sm_mhz == MAX and gpus[A].calls[-1] == ("reset",)  # reset before the ready line
        assert gpus[C].sm_mhz == 1200 and gpus[B].calls == [("reset",)]  # only the first start reset B
        assert ready_after < 10.0  # generous here; `benchmarks/clockd_results.py faults` measures it
        assert recorded(state) == {}
    finally:
        client.close()
        daemon.terminate()
        daemon.communicate(timeout=10)


@pytest.mark.slow
def test_the_guard_resets_what_a_dead_daemon_left_and_leaves_a_live_daemon_alone(tmp_path) -> None:
    store, sock, state = str(tmp_path / "gpus.json"), str(tmp_path / "c.sock"), str(tmp_path / "state.json")
    FakeNvml([FakeGpu(A), FakeGpu(B)], store=store)
    procs = [daemon_process(sock, "--state-file", state, nvml_store=store)]

    def guard() -> subprocess.Popen[str]:
        procs.append(
            subprocess.Popen(
                daemon_argv(sock, "--state-file", state, "--guard", nvml_store=store),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "PYTHONPATH": ROOT},
            )
        )
        assert procs[-1].stdout is not None and "guard" in procs[-1].stdout.readline()
        return procs[-1]

    client = ClockClient(sock, gpu_uuids=[A], ttl_s=30)
    try:
        client.lock_now(A, 1005)
        watching = guard()
        watching.send_signal(signal.SIGTERM)  # the daemon is alive: it resets its own GPUs when it stops
        out, _ = watching.communicate(timeout=30)
        assert watching.returncode == 0 and "live" in out, out
        assert FakeNvml.from_store(store).gpus[0].sm_mhz == 1005
        watching = guard()
        procs[0].send_signal(signal.SIGKILL)  # OOM-killed; then the pod is deleted (uninstall)
        procs[0].wait()
        watching.send_signal(signal.SIGTERM)
        out, _ = watching.communicate(timeout=30)
        assert watching.returncode == 0, out
        assert FakeNvml.from_store(store).gpus[0].sm_mhz == MAX
        assert not os.path.exists(sock) and recorded(state) == {}
    finally:
        client.close()
        for proc in procs:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("left", [None, "not json", '{"version": 99}'], ids=["no-file", "corrupt", "other-version"])
def test_reset_all_and_exit(tmp_path, left: str | None) -> None:
    """Every GPU reset, whatever a dead daemon's state file says (an unreadable one included: no traceback)."""
    store, sock, state = str(tmp_path / "gpus.json"), str(tmp_path / "c.sock"), str(tmp_path / "state.json")
    FakeNvml([FakeGpu(A, sm_mhz=900), FakeGpu(B, sm_mhz=1005)], store=store)
    if left is not None:
        Path(state).write_text(left)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        daemon_argv(sock, "--reset-all-and-exit", "--state-file", state, nvml_store=store),
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout) == {"reset": [A, B], "failed": {}}
    assert [g.sm_mhz for g in FakeNvml.from_store(store).gpus] == [MAX, MAX] and not os.path.exists(sock)
    assert recorded(state) == {}  # written anew: nothing left slow


@pytest.mark.parametrize("its_socket", ["b.sock", ""], ids=["another-socket", "no-socket"])
def test_reset_all_and_exit_leaves_a_daemon_that_holds_the_state_file_alone(tmp_path, its_socket) -> None:
    """Whatever socket it is given (another one, or none), a reset of everything needs the daemon's lock,
    the state file's: while a live daemon holds it, nothing is reset (the guard may run while the daemon
    stops: the socket is gone already, the state file is not)."""
    from envpipe.clock.state import StateFile

    store, state = str(tmp_path / "gpus.json"), str(tmp_path / "state.json")
    fake = FakeNvml([FakeGpu(A)], store=store)
    with daemon_thread(str(tmp_path / "a.sock"), backend=NvmlBackend(fake), state=StateFile(state)):
        lease = open_lease(str(tmp_path / "a.sock"), A)
        assert lock(str(tmp_path / "a.sock"), A, lease, 1005)[0] == 200
        sock = str(tmp_path / its_socket) if its_socket else ""
        done = subprocess.run(
            daemon_argv(sock, "--state-file", state, "--reset-all-and-exit", nvml_store=store),
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert done.returncode == 0 and "live_daemon" in done.stdout, done.stderr
        assert fake.refresh()[0].sm_mhz == 1005 and not (tmp_path / "b.sock").exists()
        assert fake.gpus[0].calls[-1] == ("lock", 1005, 1005)  # not one driver call

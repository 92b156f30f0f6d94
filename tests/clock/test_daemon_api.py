"""The daemon over a real Unix socket: listing, leases, locks, refusals, metrics, health, audit."""

from __future__ import annotations

import logging
import os
import stat
import time

import pytest

from benchmarks.clockd_study.harness import call
from envpipe.clock.backends import SimBackend
from envpipe.clock.metrics import envpipe_version
from envpipe.clock.service import ServiceConfig
from tests.support.clockd_helpers import daemon_thread, one_metric
from tests.support.scheduling import bound_s

LOW, HIGH = 900, 1410  # allow-list used below; the sim A100 supports 1410 MHz down to 210 MHz


@pytest.fixture()
def sock(tmp_path) -> str:
    return str(tmp_path / "run" / "clockd.sock")


@pytest.fixture()
def daemon(sock):
    with daemon_thread(sock, config=ServiceConfig(min_mhz=LOW, max_mhz=HIGH)) as service:
        yield service


def uuids(sock: str) -> list[str]:
    status, body = call(sock, "GET", "/v1/gpus")
    assert status == 200
    return [g["uuid"] for g in body["gpus"]]


def open_lease(sock: str, *gpus: str, **extra) -> str:
    status, body = call(sock, "POST", "/v1/leases", {"gpus": list(gpus), **extra})
    assert status == 201, body
    return body["lease"]


def test_socket_permissions_are_tight(daemon, sock) -> None:
    mode = stat.S_IMODE(os.stat(sock).st_mode)
    assert mode == 0o660


def test_list_gpus_by_uuid(daemon, sock) -> None:
    status, body = call(sock, "GET", "/v1/gpus")
    g = body["gpus"][0]
    assert status == 200 and len(body["gpus"]) == 4
    assert g["uuid"].startswith("GPU-") and g["supported_mhz"][0] == 1410
    assert g["current_mhz"] == 1410 and g["locked"] is None and g["energy_mj"] >= 0
    assert call(sock, "GET", f"/v1/gpus/{g['uuid']}")[1]["uuid"] == g["uuid"]


def test_lock_snaps_to_nearest_supported_clock_and_reset(daemon, sock, caplog) -> None:
    gpu = uuids(sock)[0]
    lease = open_lease(sock, gpu)
    with caplog.at_level(logging.INFO, logger="envpipe.clockd.audit"):
        status, body = call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1234})
    assert status == 200 and body["applied_mhz"] == 1230 and body["requested_mhz"] == 1234
    info = call(sock, "GET", f"/v1/gpus/{gpu}")[1]
    assert info["current_mhz"] == 1230 and info["locked"] == {"min_mhz": 1230, "max_mhz": 1230}
    assert any('"clock_lock"' in r.message and gpu in r.message for r in caplog.records)
    assert call(sock, "POST", f"/v1/gpus/{gpu}/reset", {"lease": lease})[0] == 200
    assert call(sock, "GET", f"/v1/gpus/{gpu}")[1]["current_mhz"] == 1410


@pytest.mark.parametrize("mhz", [LOW - 1, HIGH + 1, 210])
def test_lock_outside_allow_list_is_refused(daemon, sock, mhz) -> None:
    gpu = uuids(sock)[0]
    lease = open_lease(sock, gpu)
    status, body = call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": mhz})
    assert status == 422 and body["error"] == "out_of_range" and "[900, 1410]" in body["message"]
    assert call(sock, "GET", f"/v1/gpus/{gpu}")[1]["locked"] is None


def test_gpu_held_by_another_lease_is_refused(daemon, sock) -> None:
    a, b = uuids(sock)[:2]
    first = open_lease(sock, a)
    status, body = call(sock, "POST", "/v1/leases", {"gpus": [a]})
    assert status == 409 and body["error"] == "held_by_other_lease"
    second = open_lease(sock, b)
    status, body = call(sock, "POST", f"/v1/gpus/{a}/lock", {"lease": second, "mhz": 1000})
    assert status == 409
    status, body = call(sock, "POST", f"/v1/gpus/{uuids(sock)[2]}/lock", {"lease": first, "mhz": 1000})
    assert status == 403 and body["error"] == "not_owned"


def test_close_lease_resets_its_gpus(daemon, sock) -> None:
    gpu = uuids(sock)[0]
    lease = open_lease(sock, gpu)
    call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1000})
    assert call(sock, "DELETE", f"/v1/leases/{lease}")[0] == 200
    assert call(sock, "GET", f"/v1/gpus/{gpu}")[1]["current_mhz"] == 1410
    assert call(sock, "DELETE", f"/v1/leases/{lease}")[0] == 404
    assert (
        call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1000})[1]["error"]
        == "unknown_lease"
    )


def test_lease_expires_without_heartbeats_and_resets(sock) -> None:
    from tests.support.clockd_helpers import wait_for

    with daemon_thread(sock, config=ServiceConfig(reap_interval_s=0.05)):
        gpu = uuids(sock)[0]
        lease = open_lease(sock, gpu, ttl_s=0.6)
        call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1000})
        assert call(sock, "POST", f"/v1/leases/{lease}/renew")[0] == 200
        most = bound_s(2.0)  # the reaper may wait for the CPU on a busy machine (tests.support.scheduling)
        waited = wait_for(lambda: call(sock, "GET", f"/v1/gpus/{gpu}")[1]["locked"] is None, most + 3)
        assert 0.3 < waited < most
        assert call(sock, "POST", f"/v1/leases/{lease}/renew")[0] == 404


@pytest.mark.parametrize(
    ("method", "path", "raw", "status"),
    [
        ("POST", "/v1/leases", b"{not json", 400),
        ("POST", "/v1/leases", b"[1, 2]", 400),
        ("POST", "/v1/leases", b'{"gpus": "GPU-x"}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "color": "red"}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"]}', 404),
        ("POST", "/v1/leases", b'{"gpus": [], "ttl_s": 5}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "ttl_s": true}', 400),
        # numbers that are not finite, or that no float holds, are refused, never a 500
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "ttl_s": 1e400}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "ttl_s": ' + b"1" + b"0" * 400 + b"}", 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "ttl_s": NaN}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "ttl_s": -Infinity}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "ttl_s": ' + b"9" * 5000 + b"}", 400),
        ("POST", "/v1/gpus/GPU-nope/lock", b'{"lease": "x", "mhz": 1e400}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "pod": {"namespace": "a", "name": "x\\ny"}}', 400),
        ("POST", "/v1/leases", b'{"gpus": ["GPU-x"], "pod": {"name": "a"}}', 400),
        ("POST", "/v1/gpus/GPU-nope/lock", b'{"lease": "x", "mhz": 1000}', 404),
        ("POST", "/v1/gpus/GPU-nope/lock", b'{"lease": "x", "mhz": "1000"}', 400),
        ("POST", "/v1/gpus/GPU-nope/lock", b'{"lease": "x", "mhz": 1000.5}', 400),
        ("POST", "/v1/gpus/GPU-nope/lock", b'{"lease": "x"}', 400),
        ("POST", "/v1/leases/abc/renew", b'{"x": 1}', 400),
        ("GET", "/v1/nothing", b"", 404),
        ("PUT", "/v1/gpus", b"", 405),
    ],
)
def test_bad_requests_get_4xx_with_a_message(daemon, sock, method, path, raw, status) -> None:
    got, body = call(sock, method, path, raw=raw)
    assert got == status and body["message"]
    assert call(sock, "GET", "/healthz")[0] == 200


def test_oversized_body_is_refused(daemon, sock) -> None:
    status, body = call(sock, "POST", "/v1/leases", raw=b'{"gpus": ["' + b"x" * 40_000 + b'"]}')
    assert status == 413 and body["error"] == "body_too_large"


def test_floods_get_429_and_the_daemon_keeps_serving(sock) -> None:
    with daemon_thread(sock, max_rps=20):
        statuses = [call(sock, "GET", "/v1/gpus")[0] for _ in range(60)]
        assert statuses.count(429) > 0 and statuses[0] == 200
        time.sleep(0.2)  # the bucket refills at 20 a second
        assert call(sock, "GET", "/healthz")[0] == 200


def test_health_and_metrics(daemon, sock) -> None:
    gpu = uuids(sock)[0]
    lease = open_lease(sock, gpu)
    call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1000})
    call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 5})
    status, health = call(sock, "GET", "/healthz")
    assert status == 200 and health == {
        "ok": True,
        "status": "ok",
        "backend": "sim",
        "ownership": "local",
        "gpus": 4,
        "leases": 1,
        "unhealthy": {},
        "state_writable": True,
        "version": envpipe_version(),
    }
    assert call(sock, "GET", "/readyz") == (200, {"ready": True})
    text = call(sock, "GET", "/metrics")[1]
    assert one_metric(text, "envpipe_clockd_sm_clock_hertz", UUID=gpu, gpu="0") == 1005e6
    assert one_metric(text, "envpipe_clockd_lock_requests_total", outcome="ok") == 1
    assert one_metric(text, "envpipe_clockd_lock_requests_total", outcome="out_of_range") == 1
    assert one_metric(text, "envpipe_clockd_leases") == 1 and one_metric(text, "envpipe_clockd_ready") == 1


def test_start_and_shutdown_reset_every_gpu(sock) -> None:
    backend = SimBackend(2)
    for g in backend.gpus():
        backend.lock(g.uuid, backend.model.clocks_mhz[-1])  # a previous daemon died with GPUs locked
    with daemon_thread(sock, backend=backend):
        assert all(backend.current_mhz(g.uuid) == 1410 for g in backend.gpus())
        gpu = uuids(sock)[0]
        lease = open_lease(sock, gpu)
        call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1000})
        assert backend.current_mhz(gpu) == 1005
    assert backend.current_mhz(gpu) == 1410 and not os.path.exists(sock)


def test_concurrent_lease_requests_with_a_slow_ownership_check_cannot_both_win() -> None:
    """The kubelet check runs in threads concurrently; the lease table must still give a GPU once."""
    import asyncio
    import time

    from envpipe.clock.errors import Held
    from envpipe.clock.identity import Peer
    from envpipe.clock.service import ClockService

    class SlowPolicy:
        name = "slow"

        def check(self, peer, pod, gpus) -> None:
            time.sleep(0.1)

    service = ClockService(SimBackend(1), SlowPolicy(), ServiceConfig())
    gpu = service.backend.gpus()[0].uuid

    async def race() -> list[object]:
        return await asyncio.gather(
            *(service.open_lease(Peer(pid=i), None, [gpu], None) for i in range(2)), return_exceptions=True
        )

    results = asyncio.run(race())
    assert sum(isinstance(r, Held) for r in results) == 1 and service.health()["leases"] == 1
    service.close()


def test_nvml_and_readonly_backends_through_the_daemon(tmp_path) -> None:
    """NVML answers reach the client as HTTP statuses; readonly records locks and never applies them."""
    from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml
    from envpipe.clock.backends import NvmlBackend, ReadonlyBackend

    denied = FakeGpu("GPU-denied-0001")
    sock = str(tmp_path / "nvml.sock")
    with daemon_thread(sock, backend=NvmlBackend(FakeNvml([denied]))) as service:
        lease = open_lease(sock, denied.uuid)
        denied.writable = False  # a lock the driver refuses leaves the GPU as it was
        status, body = call(sock, "POST", f"/v1/gpus/{denied.uuid}/lock", {"lease": lease, "mhz": 1500})
        assert status == 403 and body["error"] == "no_permission" and "CAP_SYS_ADMIN" in body["message"]
        assert service.lease_exists(lease) and service.health()["leases"] == 1  # the daemon keeps serving the lease
    real = FakeGpu("GPU-real-0001", sm_mhz=1755)
    backend = ReadonlyBackend(FakeNvml([real]))
    sock = str(tmp_path / "ro.sock")
    with daemon_thread(sock, backend=backend):
        lease = open_lease(sock, real.uuid)
        status, body = call(sock, "POST", f"/v1/gpus/{real.uuid}/lock", {"lease": lease, "mhz": 1502})
        assert status == 200 and body == {
            "uuid": real.uuid,
            "requested_mhz": 1502,
            "applied_mhz": 1500,
            "applied": False,
        }
        info = call(sock, "GET", f"/v1/gpus/{real.uuid}")[1]
        assert info["current_mhz"] == 1755 and info["locked"] == {"min_mhz": 1500, "max_mhz": 1500}
    assert real.calls == []  # not one NVML write, start-up and shutdown resets included
    assert ("lock", real.uuid, 1500) in backend.recorded

"""The daemon's HTTP edge under hostile or careless callers: connection limits, header and body timeouts,
bounded JSON, Content-Type, Host and Origin on TCP, rate limits on every route, one log line per refusal,
no tracebacks for ordinary disconnects; and its metrics (energy counter, build info) and --version."""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from benchmarks.clockd_study.harness import call, daemon_process
from tests.support.clockd_helpers import ROOT, daemon_thread, one_metric
from tests.support.ports import free_port

HALF_REQUEST = b"POST /v1/leases HTTP/1.1\r\nHost: clockd\r\nContent-Type: application/json\r\n"


@pytest.fixture()
def sock(tmp_path) -> str:
    return str(tmp_path / "c.sock")


def connect(sock: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sock)
    return s


def closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while s.recv(4096):
            pass  # whatever answer came first (408 or none), then the close
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def uuids(sock: str) -> list[str]:
    return [g["uuid"] for g in call(sock, "GET", "/v1/gpus")[1]["gpus"]]


@pytest.mark.slow
def test_slow_connections_at_a_low_descriptor_limit_lock_out_no_client(sock) -> None:
    """100 half-sent requests against a daemon with 64 file descriptors: real clients still get
    answers, and the log holds no tracebacks."""
    daemon = daemon_process(sock, prefix=("sh", "-c", 'ulimit -n 64 && exec "$@"', "sh"))
    try:
        gpu = uuids(sock)[0]
        slow = []
        for _ in range(100):
            s = connect(sock)
            s.sendall(HALF_REQUEST)
            slow.append(s)
        t0 = time.monotonic()
        for _ in range(20):
            assert call(sock, "GET", f"/v1/gpus/{gpu}")[0] == 200
        assert time.monotonic() - t0 < 5.0
    finally:
        daemon.terminate()
        out, _ = daemon.communicate(timeout=10)
        for s in slow:
            s.close()
    assert "Traceback" not in out and len(out.splitlines()) < 60, out[-3000:]


def test_a_half_sent_request_head_or_silence_is_closed_after_the_header_timeout(sock) -> None:
    with daemon_thread(sock, header_timeout_s=0.5):
        half, silent = connect(sock), connect(sock)
        half.sendall(HALF_REQUEST)
        assert call(sock, "GET", "/healthz")[0] == 200  # others are served meanwhile
        assert closed_by_peer(half, 3.0) and closed_by_peer(silent, 3.0)
        half.close()
        silent.close()


def test_a_body_that_never_arrives_gets_408(sock) -> None:
    with daemon_thread(sock, body_timeout_s=0.5):
        s = connect(sock)
        s.sendall(HALF_REQUEST + b'Content-Length: 100\r\n\r\n{"gpus"')
        s.settimeout(3.0)
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
        s.close()


@pytest.mark.parametrize("raw", [b"[" * 10_000, b'{"gpus": ' + b"[" * 50 + b"]" * 50 + b"}"])
def test_deeply_nested_json_is_a_400(sock, raw) -> None:
    with daemon_thread(sock):
        status, body = call(sock, "POST", "/v1/leases", raw=raw)
        assert status == 400 and "nested" in body["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_post_bodies_must_be_json(sock, content_type) -> None:
    with daemon_thread(sock):
        gpu = uuids(sock)[0]
        status, body = call(sock, "POST", "/v1/leases", {"gpus": [gpu]}, headers={"Content-Type": content_type})
        assert status == 415 and body["error"] == "unsupported_media_type"
        status, lease = call(
            sock, "POST", "/v1/leases", {"gpus": [gpu]}, headers={"Content-Type": "application/json; charset=utf-8"}
        )
        assert status == 201
        # a POST without a body needs no Content-Type (the heartbeat of older clients)
        assert call(sock, "POST", f"/v1/leases/{lease['lease']}/renew", headers={"Content-Type": None})[0] == 200


@pytest.mark.slow
def test_the_tcp_listener_refuses_foreign_hosts_and_cross_origin_requests(sock) -> None:
    port = free_port()
    daemon = daemon_process(sock, "--tcp", f"127.0.0.1:{port}")
    try:
        gpu = uuids(sock)[0]

        def post(headers: dict[str, str]) -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("POST", "/v1/leases", body=f'{{"gpus": ["{gpu}"]}}', headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read().decode()
            finally:
                conn.close()

        json_ct = {"Content-Type": "application/json"}
        # what a browser sends for a cross-site form or fetch after DNS rebinding
        assert post({"Host": "attacker.example", **json_ct})[0] == 403
        assert post({"Origin": "http://attacker.example", **json_ct})[0] == 403
        assert post({"Content-Type": "text/plain"})[0] == 415
        assert call(sock, "GET", f"/v1/gpus/{gpu}")[1]["lease_held"] is False
        assert post({"Host": f"localhost:{port}", **json_ct})[0] == 201
    finally:
        daemon.terminate()
        daemon.communicate(timeout=10)


def test_every_route_is_rate_limited(sock) -> None:
    with daemon_thread(sock, max_rps=20):
        for path in ("/healthz", "/readyz", "/metrics", "/v1/gpus"):
            statuses = [call(sock, "GET", path)[0] for _ in range(40)]
            assert 429 in statuses, path
            time.sleep(1.1)  # the bucket refills


def test_each_refused_request_logs_one_line(sock, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="envpipe.clockd"), daemon_thread(sock):
        caplog.clear()
        assert call(sock, "POST", "/v1/leases", raw=b"{oops")[0] == 400
        assert call(sock, "GET", "/v1/gpus/GPU-nope")[0] == 404
        refusals = [
            json.loads(r.getMessage())
            for r in caplog.records
            if r.name == "envpipe.clockd" and '"refused"' in r.getMessage()
        ]
    assert [(r["status"], r["code"], r["path"]) for r in refusals] == [
        (400, "bad_request", "/v1/leases"),
        (404, "unknown_gpu", "/v1/gpus/GPU-nope"),
    ]
    assert refusals[0]["caller"] == f"pid:{os.getpid()}"


def test_clients_that_vanish_mid_request_log_no_traceback(sock, caplog) -> None:
    with caplog.at_level(logging.DEBUG), daemon_thread(sock):
        gpu = uuids(sock)[0]
        s = connect(sock)  # a client that dies halfway through its body
        s.sendall(HALF_REQUEST + b'Content-Length: 100\r\n\r\n{"gp')
        s.close()
        lease = call(sock, "POST", "/v1/leases", {"gpus": [gpu]})[1]["lease"]
        s = connect(sock)  # a client that dies holding its attach stream
        s.sendall(f"GET /v1/leases/{lease}/attach HTTP/1.1\r\nHost: clockd\r\n\r\n".encode())
        s.recv(100)
        s.close()
        time.sleep(0.5)
        assert call(sock, "GET", "/healthz")[0] == 200
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_energy_is_a_counter_and_build_info_is_exported(sock) -> None:
    from importlib.metadata import version

    with daemon_thread(sock):
        gpu = uuids(sock)[0]
        text = call(sock, "GET", "/metrics")[1]
    assert "# TYPE envpipe_clockd_energy_joules_total counter" in text
    assert one_metric(text, "envpipe_clockd_energy_joules_total", UUID=gpu, gpu="0") > 0
    assert "millijoules" not in text and "_mhz" not in text  # base units only
    assert f'version="{version("envpipe")}"' in text and "envpipe_clockd_build_info{" in text


def test_version_flag() -> None:
    from importlib.metadata import version

    out = subprocess.run(
        [sys.executable, "-m", "envpipe.clock.daemon", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0 and version("envpipe") in out.stdout

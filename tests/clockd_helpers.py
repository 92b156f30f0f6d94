"""Run a real envpipe-clockd (in a thread, or as a process) on a Unix socket and talk HTTP to it."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from envpipe.clock.backends import Backend, SimBackend
from envpipe.clock.daemon import ServeOptions, serve
from envpipe.clock.ownership import LocalPolicy, OwnershipPolicy
from envpipe.clock.service import ClockService, ServiceConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("clockd", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def call(sock: str, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    conn = UnixHTTPConnection(sock)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text.decode()
    finally:
        conn.close()


@contextlib.contextmanager
def daemon_thread(
    sock: str,
    backend: Backend | None = None,
    policy: OwnershipPolicy | None = None,
    config: ServiceConfig | None = None,
    max_rps: float = 5000.0,
) -> Iterator[ClockService]:
    service = ClockService(backend or SimBackend(4), policy or LocalPolicy(), config or ServiceConfig())
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(
                serve(service, ServeOptions(sock, None, 0, 0o660, max_rps), stop, ready.set)
            )
        except BaseException as exc:
            failed.append(exc)
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10), "daemon did not start"
    if failed:
        raise failed[0]
    try:
        yield service
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(10)
        loop.close()


def daemon_process(sock: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "envpipe.clock.daemon", "--backend", "sim", "--socket", sock, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    for line in proc.stdout:
        if '"ready"' in line:
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError("daemon process did not start")


def wait_for(pred: Any, timeout: float = 10.0) -> float:
    """Seconds until pred() is true (AssertionError after timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError("condition not met in time")

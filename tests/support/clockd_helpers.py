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
from envpipe.clock.daemon import read_state, serve, take_listeners
from envpipe.clock.listen import Lifecycle, ServeOptions
from envpipe.clock.ownership import LocalPolicy, OwnershipPolicy
from envpipe.clock.service import ClockService, ServiceConfig
from envpipe.clock.state import StateFile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("clockd", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        """Connect, waiting (up to the timeout) while the daemon's listen queue is full: a Unix socket refuses at
        once with EAGAIN then, where TCP would wait; a daemon short of CPU under a connection flood is slow to
        accept, not gone."""
        deadline = time.monotonic() + self.timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(self.timeout)
            try:
                self.sock.connect(self.path)
                return
            except BlockingIOError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)


def call(
    sock: str,
    method: str,
    path: str,
    body: Any = None,
    raw: bytes | None = None,
    headers: dict[str, str | None] | None = None,
) -> tuple[int, Any]:
    """One request on a fresh connection; ``headers`` override the JSON Content-Type (None drops one)."""
    conn = UnixHTTPConnection(sock)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {k: v for k, v in {"Content-Type": "application/json", **(headers or {})}.items() if v is not None}
        conn.request(method, path, body=data, headers=sent)
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
    state: StateFile | None = None,
    **options: Any,
) -> Iterator[ClockService]:
    """A real daemon on ``sock`` in a thread of this process; ``options`` are ServeOptions fields."""
    service = ClockService(backend or SimBackend(4), policy or LocalPolicy(), config or ServiceConfig(), state)
    opts = ServeOptions(sock, None, **options)
    listeners = take_listeners(opts)
    previous = read_state(state)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(serve(service, listeners, opts, previous, Lifecycle(stop, ready.set)))
        except BaseException as exc:
            failed.append(exc)
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(20), "daemon did not start"
    if failed:
        raise failed[0]
    try:
        yield service
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(20)
        loop.close()
        if state is not None:
            state.close()


# A daemon process whose pynvml is tests/support/fake_pynvml.py backed by a store file (argv[1]).
FAKE_NVML_DAEMON = (
    "import sys; from tests.support.fake_pynvml import install; install(sys.argv.pop(1)); "
    "from envpipe.clock.daemon import main; main()"
)


def daemon_argv(sock: str, *args: str, nvml_store: str | None = None) -> list[str]:
    """The command line of a daemon process: the sim backend, or nvml on the fake's ``nvml_store``."""
    if nvml_store is None:
        return [sys.executable, "-m", "envpipe.clock.daemon", "--backend", "sim", "--ownership", "local", "--socket",
                sock, *args]
    return [sys.executable, "-c", FAKE_NVML_DAEMON, nvml_store, "--backend", "nvml", "--ownership", "local",
            "--socket", sock, *args]


def daemon_process(
    sock: str,
    *args: str,
    nvml_store: str | None = None,
    prefix: tuple[str, ...] = (),
    seen: list[str] | None = None,
) -> subprocess.Popen[str]:
    """A daemon process, returned once it printed its ready line (its output goes on in stdout; the
    lines before the ready line are appended to ``seen``)."""
    proc = subprocess.Popen(
        [*prefix, *daemon_argv(sock, *args, nvml_store=nvml_store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    seen = [] if seen is None else seen
    for line in proc.stdout:
        if '"ready"' in line:
            return proc
        seen.append(line)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError("daemon process did not start:\n" + "".join(seen[-20:]))


def wait_for(pred: Any, timeout: float = 10.0) -> float:
    """Seconds until pred() is true (AssertionError after timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def metric(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` in a /metrics text whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]


def one_metric(text: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` with ``labels`` (AssertionError unless exactly one)."""
    found = metric(text, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0][1]

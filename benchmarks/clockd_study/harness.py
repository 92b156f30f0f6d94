"""A real envpipe-clockd process on a Unix socket (the sim backend, or nvml on fake_pynvml.py), and HTTP to it:
for the faults benchmark and the clock daemon's tests."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import ROOT


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("clockd", timeout=timeout)
        self.path = path
        self.wait_s = timeout  # HTTPConnection's own timeout may be None

    def connect(self) -> None:
        """Connect, waiting (up to the timeout) while the daemon's listen queue is full: a Unix socket refuses at
        once with EAGAIN then, where TCP would wait; a daemon short of CPU under a connection flood is slow to
        accept, not gone."""
        deadline = time.monotonic() + self.wait_s
        while True:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(self.wait_s)
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



# A daemon process whose pynvml is benchmarks/clockd_study/fake_pynvml.py backed by a store file (argv[1]).
FAKE_NVML_DAEMON = (
    "import sys; from benchmarks.clockd_study.fake_pynvml import install; install(sys.argv.pop(1)); "
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
        env={**os.environ, "PYTHONPATH": str(ROOT)},
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

"""Is a worker's sshd up? A bounded TCP check, so an unreachable worker fails fast and clearly."""

from __future__ import annotations

import socket
import time

from .errors import LaunchError


def _connect(host: str, port: int, timeout_s: float) -> OSError | None:
    """None if `host`:`port` accepts a TCP connection within `timeout_s`, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return e


def port_open(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Does something listen on `host`:`port` now? One connection attempt, no retry."""
    return _connect(host, port, timeout_s) is None


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        last = _connect(host, port, min(2.0, max(timeout_s, 0.1)))
        if last is None:
            return
        if time.monotonic() >= deadline:
            raise LaunchError(f"worker {host}:{port} unreachable after {timeout_s:g}s ({last})")
        time.sleep(0.2)

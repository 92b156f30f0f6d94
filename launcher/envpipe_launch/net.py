"""Is a worker's sshd up? A bounded TCP check, so an unreachable worker fails fast and clearly."""

from __future__ import annotations

import socket
import time

from .errors import LaunchError


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(timeout_s, 0.1))):
                return
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            raise LaunchError(f"worker {host}:{port} unreachable after {timeout_s:g}s ({last})")
        time.sleep(0.2)

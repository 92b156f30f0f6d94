"""Is a worker's sshd up (a bounded TCP check, so an unreachable worker fails fast and clearly), and
which rendezvous port is free where the master runs."""

from __future__ import annotations

import socket
import time

from .errors import LaunchError
from .job import DEFAULT_MASTER_PORT


def _connect(host: str, port: int, timeout_s: float) -> OSError | None:
    """None if `host`:`port` accepts a TCP connection within `timeout_s`, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return e
    except UnicodeError as e:  # a name the resolver cannot encode (a label over 63 characters)
        return OSError(str(e))


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


def master_port(requested: int | None, master_addr: str) -> int:
    """The port asked for, else one the kernel just handed out on `master_addr` when that address is
    this machine's (free now; a fixed 29500 collides with any other job here), else DeepSpeed's default:
    a remote master's free ports cannot be known from here."""
    if requested is not None:
        return requested
    try:
        with socket.socket() as s:  # IPv4: host names with ':' are refused (hostfile.is_host)
            s.bind((master_addr, 0))
            return int(s.getsockname()[1])
    except (OSError, UnicodeError):  # not an address of this machine, or not resolvable here
        return DEFAULT_MASTER_PORT

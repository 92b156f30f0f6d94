"""A free TCP port on the loopback interface, for tests that start servers or process groups."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the kernel just handed out and released: free now, though nothing reserves it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

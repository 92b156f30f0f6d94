"""GPU clock control: the privileged node daemon ``envpipe-clockd``, its backends and the client.

The package knows nothing about pipelines: it locks SM clocks of GPUs (by UUID) for leases.
"""

from typing import Any

__all__ = ["DEFAULT_SOCKET", "ClockClient", "ClockDaemonUnavailable"]


def __getattr__(name: str) -> Any:
    # The client (aiohttp's client side) loads on first use: the daemon, which never uses it, starts
    # (and resets what a dead daemon left) that much sooner.
    if name in __all__:
        from envpipe.clock import client

        return getattr(client, name)
    raise AttributeError(f"module 'envpipe.clock' has no attribute {name!r}")

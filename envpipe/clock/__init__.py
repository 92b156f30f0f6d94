"""GPU clock control: the privileged node daemon ``envpipe-clockd``, its backends and the client.

The package knows nothing about pipelines: it locks SM clocks of GPUs (by UUID) for leases.
"""

from envpipe.clock.client import DEFAULT_SOCKET, ClockClient, ClockDaemonUnavailable

__all__ = ["DEFAULT_SOCKET", "ClockClient", "ClockDaemonUnavailable"]

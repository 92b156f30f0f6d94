"""The daemon's Prometheus metrics, in one registry."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


def envpipe_version() -> str:
    try:
        return version("envpipe")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class _EnergyCounters(Collector):
    """The GPUs' energy counters as Prometheus counters: NVML's counter only grows (until the driver
    reloads, which Prometheus's rate() treats as a counter reset)."""

    def __init__(self) -> None:
        self.mj: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "envpipe_clockd_energy_millijoules", "GPU energy counter since the driver loaded (mJ)", labels=["gpu"]
        )
        for gpu, value in sorted(self.mj.items()):
            family.add_metric([gpu], value)
        yield family


class DaemonMetrics:
    def __init__(self, backend: str, ownership: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sm_clock = Gauge("envpipe_clockd_sm_clock_mhz", "Current SM clock", ["gpu"], registry=r)
        self.energy = _EnergyCounters()
        r.register(self.energy)
        self.healthy = Gauge(
            "envpipe_clockd_gpu_healthy", "1 while the GPU's driver calls meet their deadline", ["gpu"], registry=r
        )
        self.timeouts = Counter(
            "envpipe_clockd_driver_timeouts", "Driver calls past their deadline", ["gpu"], registry=r
        )
        self.locks = Counter("envpipe_clockd_lock_requests", "Lock requests by outcome", ["outcome"], registry=r)
        self.leases = Gauge("envpipe_clockd_leases", "Open leases", registry=r)
        self.ready = Gauge(
            "envpipe_clockd_ready", "1 once start-up resets succeeded and every GPU is healthy", registry=r
        )
        self.refused = Counter("envpipe_clockd_refused_requests", "Refused requests by code", ["code"], registry=r)
        self.connections = Gauge("envpipe_clockd_connections", "Open client connections", registry=r)
        Info("envpipe_clockd_build", "Build of the running daemon", registry=r).info(
            {
                "version": envpipe_version(),
                "python": platform.python_version(),
                "backend": backend,
                "ownership": ownership,
            }
        )

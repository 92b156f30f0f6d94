"""The daemon's Prometheus metrics, in one registry, in base units (hertz, joules, seconds).

Per-GPU series carry dcgm-exporter's label names, so that they join the GPU dashboards a cluster already
has: ``gpu`` (NVML's index on the node), ``UUID``, ``modelName``, and for a leased GPU the ``pod``,
``namespace`` and ``container`` that hold it (empty when no lease holds it). The per-lease energy counter
says how much energy each pod's GPUs used while its lease held them.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from envpipe.clock.backends import GpuStatic
from envpipe.clock.leases import Lease
from envpipe.clock.ownership import PodRef

GPU_LABELS = ["gpu", "UUID", "modelName", "pod", "namespace", "container"]
LEASE_LABELS = ["namespace", "pod", "container", "lease", "gpu", "UUID", "modelName"]


def envpipe_version() -> str:
    try:
        return version("envpipe")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def gpu_labels(static: GpuStatic, pod: PodRef | None, container: str) -> list[str]:
    return [
        str(static.index),
        static.uuid,
        static.name,
        pod.name if pod else "",
        pod.namespace if pod else "",
        container if pod else "",
    ]


@dataclass(frozen=True)
class GpuSample:
    """One GPU at scrape time."""

    static: GpuStatic
    current_mhz: int | None
    energy_mj: int | None
    healthy: bool
    timeouts: int
    pod: PodRef | None  # the pod whose lease holds the GPU
    container: str


class _GpuCollector(Collector):
    """Per-GPU families, built from the service's view at each scrape (a lease that ends takes its pod
    labels with it: no stale series)."""

    def __init__(self, samples: Callable[[], list[GpuSample]]) -> None:
        self.samples = samples

    def collect(self) -> Iterator[Metric]:
        clock = GaugeMetricFamily("envpipe_clockd_sm_clock_hertz", "Current SM clock", labels=GPU_LABELS)
        energy = CounterMetricFamily(
            "envpipe_clockd_energy_joules",
            "GPU energy counter since the driver loaded (NVML's counter: a driver reload resets it)",
            labels=GPU_LABELS,
        )
        healthy = GaugeMetricFamily(
            "envpipe_clockd_gpu_healthy", "1 while the GPU's driver calls meet their deadline", labels=GPU_LABELS
        )
        timeouts = CounterMetricFamily(
            "envpipe_clockd_driver_timeouts", "Driver calls past their deadline", labels=GPU_LABELS
        )
        for s in self.samples():
            labels = gpu_labels(s.static, s.pod, s.container)
            if s.current_mhz is not None:
                clock.add_metric(labels, s.current_mhz * 1e6)
            if s.energy_mj is not None:
                energy.add_metric(labels, s.energy_mj / 1000)
            healthy.add_metric(labels, 1.0 if s.healthy else 0.0)
            timeouts.add_metric(labels, s.timeouts)
        yield from (clock, energy, healthy, timeouts)


@dataclass
class _LeaseGpu:
    labels: list[str]
    last_mj: int
    joules: float = 0.0
    ended: float | None = None  # when the lease ended (monotonic)


class LeaseEnergy(Collector):
    """Joules each lease's GPUs used while the lease held them, from the GPUs' energy counters. An ended
    lease's counter stays for ``keep_s`` (at most ``max_ended`` of them) so that Prometheus scrapes its
    final value; a counter that goes backwards (a driver reload) adds nothing."""

    def __init__(self, keep_s: float = 600.0, max_ended: int = 4096, clock: Callable[[], float] = time.monotonic):
        self.keep_s, self.max_ended, self._now = keep_s, max_ended, clock
        self._gpus: dict[tuple[str, str], _LeaseGpu] = {}  # (lease id, gpu uuid)

    def start(self, lease: Lease, static: GpuStatic, mj: int) -> None:
        """Count from ``mj`` on; labelled with the lease's pod, the GPU's container (where known) and the GPU."""
        pod, container = lease.pod, lease.containers.get(static.uuid, "")
        labels = [pod.namespace if pod else "", pod.name if pod else "", container, lease.short]
        labels += [str(static.index), static.uuid, static.name]
        self._gpus[(lease.id, static.uuid)] = _LeaseGpu(labels, mj)

    def update(self, lease_id: str, uuid: str, mj: int) -> None:
        held = self._gpus.get((lease_id, uuid))
        if held is not None and held.ended is None:
            held.joules += max(0, mj - held.last_mj) / 1000
            held.last_mj = mj

    def end(self, lease_id: str, uuid: str) -> None:
        held = self._gpus.get((lease_id, uuid))
        if held is not None:
            held.ended = self._now()
        self._forget_old()

    def joules(self, lease_id: str, uuid: str) -> float | None:
        held = self._gpus.get((lease_id, uuid))
        return None if held is None else held.joules

    def _forget_old(self) -> None:
        now = self._now()
        ended = sorted((g.ended, k) for k, g in self._gpus.items() if g.ended is not None)
        for n, (when, key) in enumerate(ended):
            if now - when > self.keep_s or len(ended) - n > self.max_ended:
                del self._gpus[key]

    def collect(self) -> Iterator[Metric]:
        self._forget_old()
        family = CounterMetricFamily(
            "envpipe_clockd_lease_energy_joules",
            "Energy a lease's GPU used while the lease held it (per pod: sum by namespace, pod)",
            labels=LEASE_LABELS,
        )
        for held in self._gpus.values():
            family.add_metric(held.labels, held.joules)
        yield family


class DaemonMetrics:
    def __init__(self, backend: str, ownership: str, gpu_samples: Callable[[], list[GpuSample]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_GpuCollector(gpu_samples))
        self.lease_energy = LeaseEnergy()
        r.register(self.lease_energy)
        self.locks = Counter("envpipe_clockd_lock_requests", "Lock requests by outcome", ["outcome"], registry=r)
        self.leases = Gauge("envpipe_clockd_leases", "Open leases", registry=r)
        self.ready = Gauge(
            "envpipe_clockd_ready",
            "1 while /readyz answers 200: start-up resets done, GPUs healthy, state written",
            registry=r,
        )
        self.state_writable = Gauge(
            "envpipe_clockd_state_writable", "0 while the last write of the state file failed", registry=r
        )
        self.state_writable.set(1)
        self.refused = Counter("envpipe_clockd_refused_requests", "Refused requests by code", ["code"], registry=r)
        self.bad_http = Counter(
            "envpipe_clockd_bad_http_requests", "Requests the HTTP parser refused", ["listener"], registry=r
        )
        self.internal_errors = Counter("envpipe_clockd_internal_errors", "Requests answered 500 (bugs)", registry=r)
        self.connections = Gauge("envpipe_clockd_connections", "Open client connections", ["listener"], registry=r)
        self.connections_closed = Counter(
            "envpipe_clockd_connections_closed",
            "Connections the daemon closed: refused at accept, or idle ones closed to make room",
            ["listener", "why"],
            registry=r,
        )
        self.attached = Gauge("envpipe_clockd_attach_streams", "Open attach streams (one per lease)", registry=r)
        self.in_flight = Gauge("envpipe_clockd_requests_in_flight", "Requests being served", registry=r)
        Info("envpipe_clockd_build", "Build of the running daemon", registry=r).info(
            {
                "version": envpipe_version(),
                "python": platform.python_version(),
                "backend": backend,
                "ownership": ownership,
            }
        )

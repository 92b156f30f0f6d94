"""Who may lease which GPU: peer credentials of the caller and, on Kubernetes, the kubelet.

``local``: off Kubernetes. The socket's file permissions decide who may connect; any caller who can
connect may lease any GPU the daemon manages (leases still make GPUs exclusive). The caller's
uid/pid (SO_PEERCRED) is recorded in the audit log.
``kubelet``: the lease request names its pod (namespace/name, from the downward API); the daemon
asks the kubelet PodResources API which devices that pod was given and refuses other GPUs.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Protocol

from envpipe.clock.errors import BadRequest

GPU_RESOURCE_PREFIX = "nvidia.com/"  # nvidia.com/gpu and MIG resources (nvidia.com/mig-1g.10gb, ...)
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class Peer:
    """The caller: Unix peer credentials, or the TCP address (no credentials on loopback TCP)."""

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    address: str | None = None

    def describe(self) -> str:
        if self.pid is not None:
            return f"pid={self.pid} uid={self.uid} gid={self.gid}"
        return f"tcp={self.address}"

    @property
    def key(self) -> str:
        return f"pid:{self.pid}" if self.pid is not None else f"addr:{self.address}"


def peer_of(sock: socket.socket | None, peername: object) -> Peer:
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        return Peer(pid=pid, uid=uid, gid=gid)
    host = peername[0] if isinstance(peername, tuple) else str(peername)
    return Peer(address=str(host))


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class OwnershipPolicy(Protocol):
    name: str

    def check(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> None:
        """Raise NotOwned (or BadRequest) unless the caller may lease all of ``gpus``."""


class LocalPolicy:
    name = "local"

    def check(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> None:
        return None  # the socket's permissions are the gate; see the module docstring


def make_policy(name: str, pod_resources_socket: str) -> OwnershipPolicy:
    if name == "local":
        return LocalPolicy()
    if name == "kubelet":
        # grpc and the PodResources stubs are only needed (and imported) on Kubernetes
        from envpipe.clock.kubelet import KubeletPolicy

        return KubeletPolicy(pod_resources_socket)
    raise BadRequest(f"unknown ownership policy {name!r} (choose kubelet or local)")

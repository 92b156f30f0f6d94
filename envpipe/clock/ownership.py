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

import grpc

from envpipe.clock.errors import BackendFailure, BadRequest, NotOwned
from envpipe.clock.podresources import api_pb2, api_pb2_grpc

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


class KubeletPolicy:
    def __init__(self, socket_path: str = DEFAULT_POD_RESOURCES_SOCKET, timeout_s: float = 2.0) -> None:
        self.name = "kubelet"
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def pod_gpus(self, pod: PodRef) -> set[str] | None:
        """Device ids (GPU UUIDs) given to ``pod``, or None if the kubelet does not know the pod."""
        try:
            reply = self._stub.Get(
                api_pb2.GetPodResourcesRequest(pod_name=pod.name, pod_namespace=pod.namespace),
                timeout=self.timeout_s,
            )
            resources = [reply.pod_resources]
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            # Get is behind the KubeletPodResourcesGet gate on older kubelets: fall back to List.
            resources = self._list(pod)
        found = [r for r in resources if r.name == pod.name and r.namespace == pod.namespace]
        if not found:
            return None
        return {
            d
            for r in found
            for c in r.containers
            for dev in c.devices
            if dev.resource_name.startswith(GPU_RESOURCE_PREFIX)
            for d in dev.device_ids
        }

    def _list(self, pod: PodRef) -> list[api_pb2.PodResources]:
        try:
            return list(
                self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s).pod_resources
            )
        except grpc.RpcError as exc:
            raise BackendFailure(
                f"kubelet PodResources API at {self.socket_path} failed: {exc.code().name} {exc.details()}"
            ) from exc

    def check(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> None:
        if pod is None:
            raise BadRequest(
                "ownership is 'kubelet': the lease request must name its pod "
                '({"pod": {"namespace": ..., "name": ...}})'
            )
        owned = self.pod_gpus(pod)
        if owned is None:
            raise NotOwned(f"the kubelet knows no pod {pod}")
        foreign = [g for g in gpus if g not in owned]
        if foreign:
            raise NotOwned(
                f"pod {pod} does not own GPU(s) {', '.join(foreign)} "
                f"(kubelet assigned: {', '.join(sorted(owned)) or 'none'})"
            )

    def close(self) -> None:
        self._channel.close()


def make_policy(name: str, pod_resources_socket: str) -> OwnershipPolicy:
    if name == "local":
        return LocalPolicy()
    if name == "kubelet":
        return KubeletPolicy(pod_resources_socket)
    raise BadRequest(f"unknown ownership policy {name!r} (choose kubelet or local)")

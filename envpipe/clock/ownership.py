"""Who may lease which GPU: peer credentials of the caller and, on Kubernetes, the kubelet.

``local``: off Kubernetes. The socket's file permissions decide who may connect; any caller who can
connect may lease any GPU the daemon manages (leases still make GPUs exclusive). Who the caller is
(identity.Peer) is recorded in the audit log.
``kubelet``: the lease request names its pod (namespace/name, from the downward API); the daemon
asks the kubelet PodResources API which devices that pod was given and refuses other GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from envpipe.clock.identity import Peer

GPU_RESOURCE_PREFIX = "nvidia.com/"  # nvidia.com/gpu and MIG resources (nvidia.com/mig-1g.10gb, ...)
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class OwnershipPolicy(Protocol):
    name: str

    def check(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> dict[str, str]:
        """Raise NotOwned (or BadRequest) unless the caller may lease all of ``gpus``; else the name of
        the container that was given each GPU, where the policy knows it (metrics label GPUs with it)."""


class LocalPolicy:
    name = "local"

    def check(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> dict[str, str]:
        return {}  # the socket's permissions are the gate; see the module docstring

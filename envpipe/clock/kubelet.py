"""The ``kubelet`` ownership policy: which GPUs a pod was given, from the kubelet PodResources API.

Kept apart from ``ownership`` so that a daemon off Kubernetes never imports grpc.
"""

from __future__ import annotations

import grpc

from envpipe.clock.errors import BackendFailure, BadRequest, NotOwned
from envpipe.clock.identity import Peer
from envpipe.clock.ownership import DEFAULT_POD_RESOURCES_SOCKET, GPU_RESOURCE_PREFIX, PodRef
from envpipe.clock.podresources import api_pb2, api_pb2_grpc


class KubeletPolicy:
    def __init__(self, socket_path: str = DEFAULT_POD_RESOURCES_SOCKET, timeout_s: float = 2.0) -> None:
        self.name = "kubelet"
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def pod_gpus(self, pod: PodRef) -> dict[str, str] | None:
        """The device ids (GPU UUIDs) given to ``pod``, each with the name of the container that got it;
        None if the kubelet does not know the pod."""
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
            d: c.name
            for r in found
            for c in r.containers
            for dev in c.devices
            if dev.resource_name.startswith(GPU_RESOURCE_PREFIX)
            for d in dev.device_ids
        }

    def _list(self, pod: PodRef) -> list[api_pb2.PodResources]:
        try:
            return list(self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s).pod_resources)
        except grpc.RpcError as exc:
            raise BackendFailure(
                f"kubelet PodResources API at {self.socket_path} failed: {exc.code().name} {exc.details()}"
            ) from exc

    def check(self, peer: Peer, pod: PodRef | None, gpus: list[str]) -> dict[str, str]:
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
        return {g: owned[g] for g in gpus}

    def close(self) -> None:
        self._channel.close()

"""Ownership through the kubelet PodResources API: the real proto, a fake kubelet gRPC server on a
Unix socket, and the daemon refusing GPUs that the caller's pod was not given."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from benchmarks.clockd_study.harness import call
from envpipe.clock.backends import SimBackend
from envpipe.clock.errors import BackendFailure, BadRequest, NotOwned
from envpipe.clock.kubelet import KubeletPolicy
from envpipe.clock.ownership import Peer, PodRef
from envpipe.clock.podresources import api_pb2, api_pb2_grpc
from tests.support.clockd_helpers import daemon_thread, metric


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: dict[tuple[str, str], list[str]], get_enabled: bool = True) -> None:
        self.pods, self.get_enabled, self.calls = pods, get_enabled, []

    def _pod(self, ns: str, name: str) -> api_pb2.PodResources:
        devices = [
            api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=self.pods[(ns, name)]),
            api_pb2.ContainerDevices(resource_name="example.com/nic", device_ids=["nic0"]),
        ]
        return api_pb2.PodResources(
            name=name,
            namespace=ns,
            containers=[api_pb2.ContainerResources(name="trainer", devices=devices, cpu_ids=[0, 1])],
        )

    def List(self, request, context):
        self.calls.append("List")
        return api_pb2.ListPodResourcesResponse(pod_resources=[self._pod(ns, n) for ns, n in self.pods])

    def Get(self, request, context):
        self.calls.append("Get")
        if not self.get_enabled:  # what a kubelet without the KubeletPodResourcesGet gate answers
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        key = (request.pod_namespace, request.pod_name)
        if key not in self.pods:
            context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key} not found")
        return api_pb2.GetPodResourcesResponse(pod_resources=self._pod(*key))


@pytest.fixture()
def gpus() -> list[str]:
    return [g.uuid for g in SimBackend(4).gpus()]


@pytest.fixture(params=[True, False], ids=["Get", "List-fallback"])
def kubelet(request, tmp_path, gpus):
    fake = FakeKubelet(
        {("team", "trainer-0"): gpus[:2], ("other", "job"): gpus[2:3]}, get_enabled=request.param
    )
    server = grpc.server(futures.ThreadPoolExecutor(2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    path = str(tmp_path / "kubelet.sock")
    server.add_insecure_port(f"unix://{path}")
    server.start()
    yield path, fake
    server.stop(0)


def test_policy_allows_the_pods_own_gpus_only(kubelet, gpus) -> None:
    path, fake = kubelet
    policy = KubeletPolicy(path)
    pod = PodRef("team", "trainer-0")
    assert policy.pod_gpus(pod) == dict.fromkeys(gpus[:2], "trainer")
    policy.check(Peer(pid=1), pod, gpus[:2])
    with pytest.raises(NotOwned, match=f"does not own GPU.*{gpus[2]}"):
        policy.check(Peer(pid=1), pod, [gpus[0], gpus[2]])
    with pytest.raises(NotOwned, match="knows no pod team/ghost"):
        policy.check(Peer(pid=1), PodRef("team", "ghost"), gpus[:1])
    with pytest.raises(BadRequest, match="must name its pod"):
        policy.check(Peer(pid=1), None, gpus[:1])
    assert ("List" in fake.calls) != fake.get_enabled
    policy.close()


def test_unreachable_kubelet_is_a_clear_502(tmp_path, gpus) -> None:
    policy = KubeletPolicy(str(tmp_path / "absent.sock"), timeout_s=0.5)
    with pytest.raises(BackendFailure, match="kubelet PodResources API") as exc:
        policy.check(Peer(pid=1), PodRef("a", "b"), gpus[:1])
    assert exc.value.status == 502


def test_daemon_refuses_gpus_of_other_pods(kubelet, gpus, tmp_path) -> None:
    path, _ = kubelet
    sock = str(tmp_path / "clockd.sock")
    with daemon_thread(sock, policy=KubeletPolicy(path)):
        pod = {"namespace": "team", "name": "trainer-0"}
        status, body = call(sock, "POST", "/v1/leases", {"gpus": gpus[:2], "pod": pod})
        assert status == 201
        status, body = call(sock, "POST", "/v1/leases", {"gpus": [gpus[2]], "pod": pod})
        assert status == 403 and body["error"] == "not_owned" and "team/trainer-0" in body["message"]
        status, body = call(sock, "POST", "/v1/leases", {"gpus": [gpus[3]]})
        assert status == 400 and "must name its pod" in body["message"]
        # metrics name the pod and the container the kubelet gave each leased GPU (dcgm-exporter's labels)
        text = call(sock, "GET", "/metrics")[1]
        labels = {"pod": "trainer-0", "namespace": "team", "container": "trainer"}
        assert {s["UUID"] for s, _ in metric(text, "envpipe_clockd_sm_clock_hertz", **labels)} == set(gpus[:2])
        assert metric(text, "envpipe_clockd_sm_clock_hertz", UUID=gpus[2])[0][0]["pod"] == ""

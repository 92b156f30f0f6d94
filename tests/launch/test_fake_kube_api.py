"""The fake API server and its controllers answer as the real ones do, for what the launcher relies on
(tests/support/fakes/kube_api.py, kube_controllers.py), through the real `kubernetes` client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.clockd_helpers import wait_for
from tests.support.fakes.kube_api import FakeKubeAPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from helm_binary import find_kubectl

INDEX = "batch.kubernetes.io/job-completion-index"


def _job(name: str = "j", n: int = 2, suspend: bool = False, labels: dict | None = None) -> dict:
    pod = {"restartPolicy": "Never", "subdomain": name, "containers": [{"name": "c", "image": "x", "args": ["worker"]}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n, "suspend": suspend,
                     "backoffLimit": 0, "template": {"metadata": {"labels": {"app": name}}, "spec": pod}}}


def _post(fake: FakeKubeAPI, path: str, body: dict, method: str = "POST",
          content_type: str = "application/json") -> tuple[int, str]:
    req = urllib.request.Request(f"{fake.url}{path}", json.dumps(body).encode(), {"Content-Type": content_type},
                                 method=method)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_api_errors_are_the_api_servers(api: FakeKubeAPI) -> None:
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(api.client()).read_namespaced_pod("nope", "default")
    assert e.value.status == 404
    # kubernetes 37 already refuses this object client-side, so post it as raw HTTP
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"},
           "spec": {"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": "ssh"}]}]}}
    code, text = _post(api, "/api/v1/namespaces/default/pods", bad)
    assert code == 422 and "is not of type 'integer'" in text
    assert _post(api, "/apis/batch/v1/namespaces/default/jobs", _job())[0] == 201
    assert _post(api, "/apis/batch/v1/namespaces/default/jobs/j", [{"op": "remove"}], "PATCH",  # type: ignore[arg-type]
                 "application/json-patch+json")[0] == 415
    code, text = _post(api, "/apis/batch/v1/namespaces/default/jobs/j", {"spec": {"completions": "x"}}, "PATCH",
                       "application/merge-patch+json")
    assert code == 422 and "spec.completions: 'x' is not of type 'integer'" in text


def test_job_controller_makes_indexed_pods_as_kubernetes_does(api: FakeKubeAPI) -> None:
    batch = client.BatchV1Api(api.client())
    created = batch.create_namespaced_job("default", _job(n=3))
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}  # the API's defaults
    assert created.spec.template.metadata.labels["batch.kubernetes.io/job-name"] == "j"
    wait_for(lambda: len(api.names("pods")) == 3)
    pods = sorted(api.items("pods", "default"), key=lambda p: p["metadata"]["annotations"][INDEX])
    for i, pod in enumerate(pods):
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["name"].startswith(f"j-{i}-") and len(meta["name"]) == len(f"j-{i}-") + 5
        assert meta["annotations"][INDEX] == meta["labels"][INDEX] == str(i)
        assert (spec["hostname"], spec["subdomain"]) == (f"j-{i}", "j")  # DNS j-<i>.j under a headless Service j
        assert {"name": "JOB_COMPLETION_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX}']"}}} in spec["containers"][0]["env"]
        assert meta["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": uid,
                                            "controller": True, "blockOwnerDeletion": True}]
    client.CustomObjectsApi(api.client()).delete_namespaced_custom_object("batch", "v1", "default", "jobs", "j")
    assert api.names("pods") == []  # the garbage collector


def test_suspend_makes_no_pods_and_removes_running_ones(api: FakeKubeAPI) -> None:
    batch = client.BatchV1Api(api.client())
    batch.create_namespaced_job("default", _job(suspend=True))
    time.sleep(0.3)
    assert api.names("pods") == []
    assert api.get("jobs", "default", "j")["status"]["conditions"][0]["type"] == "Suspended"  # type: ignore[index]
    batch.patch_namespaced_job("j", "default", {"spec": {"suspend": False}})
    wait_for(lambda: len(api.names("pods")) == 2)
    batch.patch_namespaced_job("j", "default", {"spec": {"suspend": True}})  # as Kueue preempts
    wait_for(lambda: api.names("pods") == [])


def test_jobset_controller_makes_its_jobs_service_and_pods(api: FakeKubeAPI) -> None:
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "s"},
          "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": _job()["spec"]}}]}}
    created = client.CustomObjectsApi(api.client()).create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", js)
    assert created["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}  # webhook
    wait_for(lambda: len(api.names("pods")) == 2)
    assert api.names("jobs") == ["s-node-0"]
    job = api.get("jobs", "default", "s-node-0")
    assert job is not None and job["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] == "s"
    svc = api.get("services", "default", "s")
    assert svc is not None and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"jobset.sigs.k8s.io/jobset-name": "s"}
    assert svc["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    hosts = sorted((p["spec"]["hostname"], p["spec"]["subdomain"]) for p in api.items("pods", "default"))
    assert hosts == [("s-node-0-0", "s"), ("s-node-0-1", "s")]
    assert api.rejected == []


def test_a_cluster_without_jobset_answers_404() -> None:
    fake = FakeKubeAPI(jobset=False).start()
    try:
        code, text = _post(fake, "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets", {})
        assert code == 404 and "the server could not find the requested resource" in text
        with urllib.request.urlopen(f"{fake.url}/apis") as resp:
            groups = [g["name"] for g in json.load(resp)["groups"]]
        assert groups == ["batch"]
    finally:
        fake.stop()


def test_kueue_suspends_queued_work_and_admits_known_queues_only(api: FakeKubeAPI) -> None:
    batch = client.BatchV1Api(api.client())
    batch.create_namespaced_job("default", _job("a", labels={"kueue.x-k8s.io/queue-name": "team-a"}))
    batch.create_namespaced_job("default", _job("b", labels={"kueue.x-k8s.io/queue-name": "nobody"}))
    assert api.get("jobs", "default", "b")["spec"]["suspend"] is True  # type: ignore[index]  # the webhook
    wait_for(lambda: len(api.names("pods")) == 2)
    time.sleep(0.3)
    assert all(p.startswith("a-") for p in api.names("pods")) and api.kueue.admitted == ["jobs/a"]


def test_version_is_answered_as_kubernetes_answers_it_and_drops_what_it_does_not_serve(tmp_path) -> None:
    """The real kubectl reads /version as from a real server; below 1.31 a Job's successPolicy is dropped on
    create (unknown before 1.30, an alpha gate in 1.30), as the API server drops it."""
    fake = FakeKubeAPI(version="1.30").start()
    try:
        done = subprocess.run([str(find_kubectl()), "--kubeconfig", str(fake.kubeconfig(tmp_path / "kubeconfig")),
                               "version", "-o", "json"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        server = json.loads(done.stdout)["serverVersion"]
        assert (server["major"], server["minor"]) == ("1", "30") and server["gitVersion"].startswith("v1.30.")
        assert client.VersionApi(fake.client()).get_code().git_version == server["gitVersion"]
        job = _job("s")
        job["spec"]["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
        made = client.BatchV1Api(fake.client()).create_namespaced_job("default", job)
        assert made.spec.success_policy is None and fake.rejected == []
    finally:
        fake.stop()

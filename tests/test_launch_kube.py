"""kube backend through the real `kubernetes` client over real HTTP against tests/fakes/kube_api.py.

Every object the launcher sends is validated by the fake against the official schemas
(kubernetes-validate); a 422 would fail the launch and show up in `api.rejected`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from envpipe_launch.backends import kube
from envpipe_launch.errors import LaunchError
from envpipe_launch.job import JobSpec
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fakes.kube_api import FakeKubeAPI

ROOT = Path(__file__).resolve().parent.parent
PLURALS = ("pods", "services", "secrets", "configmaps")


@pytest.fixture
def api():
    fake = FakeKubeAPI().start()
    yield fake
    fake.stop()


def _client(fake: FakeKubeAPI) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = fake.url
    return client.ApiClient(cfg)


def _spec(nodes: int = 3, gpus: int = 2) -> JobSpec:
    return JobSpec(
        nodes=nodes,
        gpus_per_node=gpus,
        script="examples/train_gpt.py",
        script_args=["--steps", "5"],
        backend="kube",
        script_on_workers=True,
    ).validate()


def _launch(fake: FakeKubeAPI, spec: JobSpec | None = None, **opts) -> int:
    opts.setdefault("image", "registry.example/envpipe-runtime:1")
    opts.setdefault("name", "t")
    opts.setdefault("ready_timeout_s", 20)
    return kube.launch(spec or _spec(), kube.KubeOptions(**opts), api_client=_client(fake))


def _leftovers(fake: FakeKubeAPI) -> dict[str, list[str]]:
    return {p: fake.names(p) for p in PLURALS if fake.names(p)}


def test_ssh_mode_runs_and_cleans_up(api: FakeKubeAPI, capsys) -> None:
    assert _launch(api) == 0
    out = capsys.readouterr()
    # the launcher pod saw the hostfile built from the three worker pod IPs
    hostfile = [ln for ln in out.out.splitlines() if "slots=" in ln]
    assert len(hostfile) == 3 and all(ln.startswith("10.244.") and ln.endswith(" slots=2") for ln in hostfile)
    assert "deepspeed --hostfile /etc/envpipe/hostfile/hostfile --master_addr 10.244." in out.out
    assert "--launcher pdsh --ssh_port 2222" in out.out
    assert "workers ready" in out.err and "3/3" in out.err
    assert api.rejected == []
    assert _leftovers(api) == {}
    assert api.requests["GET pods watch"] >= 1  # readiness by watch
    assert api.requests["DELETE configmaps/name"] == 1  # one delete: the owner references do the rest


def test_exit_code_is_passed_through(api: FakeKubeAPI) -> None:
    api.job_exit_code = 3
    assert _launch(api) == 3
    assert _leftovers(api) == {}


def test_no_ssh_mode_runs_deepspeed_on_every_worker(api: FakeKubeAPI, capsys) -> None:
    api.job_exit_code = 0
    assert _launch(api, _spec(nodes=2), no_ssh=True) == 0
    out = capsys.readouterr().out
    assert "t-worker-0.t slots=2" in out and "t-worker-1.t slots=2" in out
    assert "--no_ssh --node_rank=0" in out
    assert _leftovers(api) == {} and api.rejected == []


def test_no_ssh_worker_that_finishes_before_the_last_starts(api: FakeKubeAPI) -> None:
    api.run_s = 0  # worker 0 ends while later workers are still being created
    assert _launch(api, _spec(nodes=4), no_ssh=True) == 0
    assert _leftovers(api) == {}


def test_keep_leaves_the_job_and_owner_delete_removes_it(api: FakeKubeAPI) -> None:
    assert _launch(api, keep=True) == 0
    left = _leftovers(api)
    assert len(left["pods"]) == 4 and left["services"] == ["t"] and left["secrets"] == ["t-ssh"]
    client.CoreV1Api(_client(api)).delete_namespaced_config_map("t", "default")  # like kubectl delete
    assert _leftovers(api) == {}


def test_image_pull_failure_is_reported_and_cleaned(api: FakeKubeAPI) -> None:
    with pytest.raises(LaunchError, match="ErrImagePull"):
        _launch(api, image="registry.example/does-not-exist:1")
    assert _leftovers(api) == {}


def test_quota_refusal_is_reported_and_cleaned(api: FakeKubeAPI) -> None:
    api.pod_quota = 2
    with pytest.raises(LaunchError, match=r"HTTP 403.*exceeded quota"):
        _launch(api)
    assert _leftovers(api) == {}


def test_existing_name_is_a_clear_error_and_untouched(api: FakeKubeAPI) -> None:
    core = client.CoreV1Api(_client(api))
    core.create_namespaced_config_map(
        "default",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "t"}, "data": {"mine": "yes"}},
    )
    with pytest.raises(LaunchError, match=r"HTTP 409.*already exists"):
        _launch(api)
    assert _leftovers(api) == {"configmaps": ["t"]}
    assert core.read_namespaced_config_map("t", "default").data == {"mine": "yes"}


def test_readiness_timeout_cleans_up(api: FakeKubeAPI) -> None:
    api.start_delay_s = 30
    with pytest.raises(LaunchError, match=r"timed out after 1s: 0/3 workers ready"):
        _launch(api, ready_timeout_s=1)
    assert _leftovers(api) == {}


def test_fake_answers_like_the_api_server(api: FakeKubeAPI) -> None:
    core = client.CoreV1Api(_client(api))
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod("nope", "default")
    assert e.value.status == 404
    # kubernetes 37 already refuses this object client-side, so post it as raw HTTP
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "b"},
        "spec": {"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": "ssh"}]}]},
    }
    req = urllib.request.Request(
        f"{api.url}/api/v1/namespaces/default/pods",
        json.dumps(bad).encode(),
        {"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as h:
        urllib.request.urlopen(req)
    assert h.value.code == 422 and "is not of type 'integer'" in h.value.read().decode()


@pytest.mark.parametrize(
    ("gpus", "opts", "message"),
    [
        (0, {}, "no GPUs requested"),
        (1, {"image": None}, "needs --image"),
        (1, {"cpu_only": True}, "--cpu conflicts"),
    ],
)
def test_bad_input_touches_nothing(api: FakeKubeAPI, gpus: int, opts: dict, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        _launch(api, _spec(gpus=gpus), **opts)
    assert sum(api.requests.values()) == 0


def test_dry_run_manifests_are_schema_valid(capsys) -> None:
    assert kube.launch(_spec(), kube.KubeOptions(image="img:1", name="d"), dry_run_only=True) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "Secret", "Service", "Pod", "Pod", "Pod", "ConfigMap", "Pod"]
    for d in docs:
        kubernetes_validate.validate(d, "1.33", strict=True)
    worker = docs[3]["spec"]
    assert worker["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert {"name": "clockd", "hostPath": {"path": "/run/envpipe", "type": "DirectoryOrCreate"}} in worker[
        "volumes"
    ]
    assert worker["containers"][0]["readinessProbe"] == {"tcpSocket": {"port": 2222}, "periodSeconds": 2}


def test_cli_ctrl_c_cleans_up(api: FakeKubeAPI, tmp_path: Path) -> None:
    """The real CLI with a kubeconfig file; SIGINT while waiting for workers leaves nothing behind."""
    api.start_delay_s = 60
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            }
        )
    )
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "envpipe_launch",
            "--backend",
            "kube",
            "--nodes",
            "2",
            "--image",
            "img:1",
            "--name",
            "c",
            "--",
            "train.py",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while len(api.names("pods")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.names("pods") == ["c-worker-0", "c-worker-1"]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert _leftovers(api) == {}

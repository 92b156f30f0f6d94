"""kube backend through the real `kubernetes` client over real HTTP against tests/support/fakes/kube_api.py.

Every object the launcher sends is validated by the fake against the official schemas
(kubernetes-validate); a 422 would fail the launch and show up in `api.rejected`.
"""

from __future__ import annotations

import json
import os
import re
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

from tests.support.fakes.kube_api import FakeKubeAPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from helm_binary import find_kubectl  # noqa: E402

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


def _kubeconfig(tmp_path: Path, fake: FakeKubeAPI) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": "default"}}],
            }
        )
    )
    return path


def _leftovers(fake: FakeKubeAPI) -> dict[str, list[str]]:
    return {p: fake.names(p) for p in PLURALS if fake.names(p)}


def test_ssh_mode_runs_and_cleans_up(api: FakeKubeAPI, capsys) -> None:
    assert _launch(api) == 0
    out = capsys.readouterr()
    # the launcher pod saw the hostfile of the three workers' DNS names under the headless Service
    hostfile = [ln for ln in out.out.splitlines() if "slots=" in ln]
    assert hostfile == [f"t-worker-{i}.t slots=2" for i in range(3)]
    assert "deepspeed --hostfile /etc/envpipe/job/hostfile --master_addr t-worker-0.t" in out.out
    assert "--launcher pdsh --ssh_port 2222" in out.out
    assert "workers ready" in out.err and "3/3" in out.err and "workers ready at 10.244." in out.err
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


def _dry_run_text(capsys, spec: JobSpec | None = None, **opts) -> str:
    opts.setdefault("image", "img:1")
    opts.setdefault("name", "d")
    assert kube.launch(spec or _spec(), kube.KubeOptions(**opts), dry_run_only=True) == 0
    return capsys.readouterr().out


def _dry_run(capsys, spec: JobSpec | None = None, **opts) -> list[dict]:
    return list(yaml.safe_load_all(_dry_run_text(capsys, spec, **opts)))


def test_dry_run_manifests_are_schema_valid(capsys) -> None:
    docs = _dry_run(capsys)
    assert [d["kind"] for d in docs] == ["ConfigMap", "Secret", "Service", "ConfigMap", "Pod", "Pod", "Pod", "Pod"]
    for d in docs:
        kubernetes_validate.validate(d, "1.33", strict=True)
    worker = docs[4]["spec"]
    assert worker["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}
    assert {"name": "clockd", "hostPath": {"path": "/run/envpipe", "type": "DirectoryOrCreate"}} in worker[
        "volumes"
    ]
    assert worker["containers"][0]["readinessProbe"] == {"tcpSocket": {"port": 2222}, "periodSeconds": 2}


def test_dry_run_has_no_placeholders_and_a_real_key(capsys) -> None:
    docs = _dry_run(capsys)
    text = yaml.safe_dump_all(docs)
    assert not re.search(r"<[A-Za-z][^<>]*>", text) and "ownerReferences" not in text  # no "<job uid>"
    secret = docs[1]["stringData"]
    assert secret["ssh-privatekey"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert secret["authorized_keys"] == secret["ssh-publickey"] and secret["ssh-publickey"].startswith("ssh-ed25519 ")
    assert docs[3]["data"]["hostfile"] == "".join(f"d-worker-{i}.d slots=2\n" for i in range(3))


def test_pods_pass_what_a_cluster_admin_checks(capsys) -> None:
    """Pod Security "restricted" field by field, apart from the clockd hostPath (documented exception)."""
    docs = _dry_run(capsys)
    for pod in (d for d in docs if d["kind"] == "Pod"):
        spec = pod["spec"]
        ctx = spec["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 1000
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True,
            }
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]) and {"cpu", "memory"} <= set(res["limits"])
        kinds = {next(k for k in v if k != "name") for v in spec["volumes"]}
        allowed = {"secret", "configMap", "emptyDir"} | ({"hostPath"} if pod["metadata"]["labels"][
            "envpipe.io/role"] == "worker" else set())
        assert kinds <= allowed, kinds
    launcher = docs[-1]["spec"]
    assert "supplementalGroups" not in launcher["securityContext"]
    assert not any("hostPath" in v for v in launcher["volumes"])


def test_worker_pod_mounts_the_socket_read_only_with_its_identity(capsys) -> None:
    worker = _dry_run(capsys)[4]["spec"]
    (c,) = worker["containers"]
    assert c["args"] == ["worker"]
    assert {"name": "clockd", "mountPath": "/run/envpipe", "readOnly": True} in c["volumeMounts"]
    assert worker["securityContext"]["supplementalGroups"] == [2500]
    env = {e["name"]: e for e in c["env"]}
    assert env["ENVPIPE_CLOCKD_SOCKET"]["value"] == "/run/envpipe/clockd.sock"
    for var, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                      ("POD_UID", "metadata.uid")):
        assert env[var]["valueFrom"] == {"fieldRef": {"fieldPath": path}}
    shm = next(v for v in worker["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_scheduling_and_socket_options_reach_the_pods(capsys, tmp_path: Path) -> None:
    affinity = tmp_path / "affinity.yaml"
    affinity.write_text(
        "nodeAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    nodeSelectorTerms:\n"
        "    - matchExpressions: [{key: gpu.type, operator: In, values: [h200]}]\n"
    )
    pods = kube.pod_settings(
        cpu=8, memory_gib=64, shm_gib=16, node_selector=("nvidia.com/gpu.present=true",),
        tolerations=("nvidia.com/gpu:NoSchedule", "team=ml:NoExecute", "spot"), affinity_file=str(affinity),
        image_pull_secrets=("regcred",), priority_class="training-high", clockd_dir="/var/run/clk/",
        clockd_gid=3100,
    )
    docs = _dry_run(capsys, pods=pods)
    for d in docs:
        kubernetes_validate.validate(d, "1.33", strict=True)
    worker, launcher = docs[4]["spec"], docs[-1]["spec"]
    assert worker["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert worker["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
        {"key": "spot", "operator": "Exists"},
    ]
    assert worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert worker["containers"][0]["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    assert worker["securityContext"]["supplementalGroups"] == [3100]
    assert {"name": "clockd", "hostPath": {"path": "/var/run/clk", "type": "DirectoryOrCreate"}} in worker["volumes"]
    for spec in (worker, launcher):
        assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["priorityClassName"] == "training-high"
    assert "nodeSelector" not in launcher and "tolerations" not in launcher  # it needs no GPU node


def test_dollar_signs_reach_the_job_unexpanded(capsys) -> None:
    """The kubelet expands $(VAR) and $$ in args and env values: what the user wrote must survive it."""
    spec = JobSpec(nodes=1, gpus_per_node=1, script="t.py", script_args=["--tag", "$(HOME)-$$"], backend="kube",
                   env=["X=a$(B)"], script_on_workers=True)
    docs = _dry_run(capsys, spec, no_ssh=True)
    (c,) = docs[4]["spec"]["containers"]
    assert c["args"][-1].endswith("--tag '$$(HOME)-$$$$'")
    assert {"name": "X", "value": "a$$(B)"} in c["env"]


def test_no_clockd_pods_mount_no_host_path(capsys) -> None:
    docs = _dry_run(capsys, pods=kube.pod_settings(no_clockd=True))
    text = yaml.safe_dump_all(docs)
    assert "hostPath" not in text and "ENVPIPE_CLOCKD_SOCKET" not in text and "supplementalGroups" not in text


def test_env_reaches_every_node_through_deepspeeds_env_file(api: FakeKubeAPI, capsys) -> None:
    assert _launch(api, JobSpec(nodes=2, gpus_per_node=1, script="s.py", backend="kube", env=["A=1", "B=x y"],
                                script_on_workers=True), name="e") == 0
    out = capsys.readouterr().out
    assert "e-job/deepspeed_env:\nA=1\nB=x y\n" in out


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"cpu": 0}, "--worker-cpu must be >= 1"),
        ({"shm_gib": 0}, "--shm-size must be >= 1"),
        ({"node_selector": ("novalue",)}, "--node-selector expects KEY=VALUE"),
        ({"node_selector": ("a b=c",)}, "--node-selector expects KEY=VALUE"),
        ({"tolerations": ("gpu:Sometimes",)}, "--toleration expects KEY[=VALUE][:EFFECT]"),
        ({"image_pull_secrets": ("Bad_Name",)}, "--image-pull-secret 'Bad_Name' is not a Kubernetes object name"),
        ({"priority_class": "x y"}, "--priority-class 'x y' is not a Kubernetes object name"),
        ({"clockd_dir": "run/envpipe"}, "--clockd-dir must be an absolute path"),
        ({"clockd_gid": 0}, "--clockd-gid must lie in 1..2147483647"),
        ({"no_clockd": True, "clockd_gid": 5}, "--no-clockd conflicts with --clockd-dir and --clockd-gid"),
        ({"affinity_file": "/nonexistent/affinity.yaml"}, "cannot read --affinity /nonexistent/affinity.yaml"),
    ],
)
def test_bad_pod_options_are_one_clear_error(opts: dict, message: str) -> None:
    with pytest.raises(LaunchError, match=re.escape(message)):
        kube.pod_settings(**opts)


def test_affinity_file_must_hold_affinity(tmp_path: Path) -> None:
    bad = tmp_path / "a.yaml"
    bad.write_text("nodeSelector: {a: b}\n")
    with pytest.raises(LaunchError, match="must hold a mapping of nodeAffinity, podAffinity, podAntiAffinity"):
        kube.pod_settings(affinity_file=str(bad))


def test_shm_must_fit_in_the_memory_limit(api: FakeKubeAPI) -> None:
    with pytest.raises(LaunchError, match=r"--shm-size 16 GiB must be below --worker-memory 16 GiB"):
        _launch(api, pods=kube.pod_settings(shm_gib=16))
    assert sum(api.requests.values()) == 0


def test_dry_run_is_accepted_by_kubectl_and_kubernetes_validate(api: FakeKubeAPI, capsys, tmp_path: Path) -> None:
    """The real kubectl (the static one from the helm wheel) applies the dry run against the fake API
    server's discovery, and the kubernetes-validate CLI checks it strictly."""
    kubeconfig = _kubeconfig(tmp_path, api)
    validator = Path(sys.executable).parent / "kubernetes-validate"
    for name, opts in (("s", {}), ("n", {"no_ssh": True}), ("c", {"pods": kube.pod_settings(no_clockd=True)})):
        text = _dry_run_text(capsys, name=name, **opts)  # "n": YAML 1.1 (kubectl) reads an unquoted n as false
        docs = list(yaml.safe_load_all(text))
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(text)
        applied = subprocess.run(
            [str(find_kubectl()), "--kubeconfig", str(kubeconfig), "apply", "--dry-run=client", "--validate=false",
             "-f", str(manifest)],
            capture_output=True, text=True,
        )
        assert applied.returncode == 0, applied.stderr
        created = [f"{d['kind'].lower()}/{d['metadata']['name']} created (dry run)" for d in docs]
        assert applied.stdout.splitlines() == created
        validated = subprocess.run(
            [str(validator), "--strict", "-k", "1.33", str(manifest)], capture_output=True, text=True
        )
        assert validated.returncode == 0, validated.stdout + validated.stderr
    assert _leftovers(api) == {}  # a client dry run creates nothing


def test_cli_ctrl_c_cleans_up(api: FakeKubeAPI, tmp_path: Path) -> None:
    """The real CLI with a kubeconfig file; SIGINT while waiting for workers leaves nothing behind."""
    api.start_delay_s = 60
    env = dict(os.environ, KUBECONFIG=str(_kubeconfig(tmp_path, api)), PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
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

"""What the kube backend asks of the cluster: `--dry-run`'s manifests for both workloads (an Indexed
batch/v1 Job, a JobSet), checked against the official Kubernetes schemas of the oldest version the launcher
supports and of the newest kubernetes-validate ships, and JobSet's CRD schema (tests/support/schemas), applied
by the real kubectl, and field by field for the batch conventions (Indexed, failure policy, success policy
where the cluster serves it, Kueue, TTL), for what a cluster admin checks in pods, and for keys: none printed."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from envpipe_launch import kube_version
from envpipe_launch.backends import kube
from envpipe_launch.cli import main as launch_main
from envpipe_launch.errors import LaunchError
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import Batch

from tests.support import schemas
from tests.support.fakes.kube_api import FakeKubeAPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from helm_binary import find_kubectl  # noqa: E402

KINDS = {"job": ["ConfigMap", "Service", "Job"], "jobset": ["ConfigMap", "JobSet"]}  # no Secret: no key printed
VERSIONS = (schemas.OLDEST, schemas.NEWEST)


def _spec(nodes: int = 3, gpus: int = 2, **kw) -> JobSpec:
    return JobSpec(nodes=nodes, gpus_per_node=gpus, script="examples/train_gpt.py", script_args=["--steps", "5"],
                   backend="kube", script_on_workers=True, **kw)


def _text(capsys, spec: JobSpec | None = None, workload: str = "job", **opts) -> str:
    opts.setdefault("image", "img:1")
    opts.setdefault("name", "d")
    batch = opts.pop("batch", Batch(workload))
    assert kube.launch(spec or _spec(), kube.KubeOptions(batch=batch, dry_run=True, **opts)) == 0
    return capsys.readouterr().out


def _docs(capsys, spec: JobSpec | None = None, workload: str = "job", **opts) -> list[dict]:
    return list(yaml.safe_load_all(_text(capsys, spec, workload, **opts)))


def _template(docs: list[dict]) -> dict:
    """The pod template of the workload (the last document)."""
    workload = docs[-1]
    job = workload["spec"] if workload["kind"] == "Job" else workload["spec"]["replicatedJobs"][0]["template"]["spec"]
    return job["template"]


@pytest.mark.parametrize("workload", ["job", "jobset"])
def test_dry_run_is_schema_valid_for_both_workloads_from_the_oldest_kubernetes_to_the_newest(capsys, workload):
    assert str(kube_version.MIN) == schemas.OLDEST  # the range docs/launcher.md states, checked at both ends
    for no_ssh in (False, True):
        docs = _docs(capsys, workload=workload, no_ssh=no_ssh)
        assert [d["kind"] for d in docs] == KINDS[workload]
        for d in docs:
            for version in VERSIONS:
                schemas.validate(d, version)


def _job(workload: str = "job", **opts) -> kube.KubeJob:
    opts.setdefault("image", "img:1")
    opts.setdefault("name", "d")
    return kube.build_job(_spec(), kube.KubeOptions(batch=Batch(workload), **opts))


@pytest.mark.parametrize("workload", ["job", "jobset"])
def test_the_success_policy_only_where_the_cluster_serves_it(workload: str) -> None:
    """A Job's successPolicy is refused by the schemas before 1.30 (and dropped by 1.30's API server): the
    launcher adds it where the cluster runs 1.31+, and nodes > 0 end with node 0 everywhere."""
    job = _job(workload)
    served = dataclasses.replace(job, success_policy=True).workload(suspend=False)
    portable = job.workload(suspend=False)
    with pytest.raises(schemas.Invalid, match="successPolicy"):
        schemas.validate(served, "1.29")
    schemas.validate(served, schemas.NEWEST)
    for version in VERSIONS:
        schemas.validate(portable, version)
    spec = served["spec"] if workload == "job" else served["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    env = {e["name"]: e.get("value") for e in _template([portable])["spec"]["containers"][0]["env"]}
    assert env["ENVPIPE_LAUNCHER_NODE"] == f"{job.hosts()[0]}:2222"  # where node 0's sshd is, for the others


def test_the_job_follows_the_batch_conventions(capsys) -> None:
    job = _docs(capsys)[-1]
    assert job["apiVersion"] == "batch/v1" and job["metadata"]["name"] == "d"
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["suspend"] is False and spec["ttlSecondsAfterFinished"] == 86400  # no queue: runs when applied
    assert spec["backoffLimit"] == 0 and "activeDeadlineSeconds" not in spec
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onPodConditions": [],  # 1.27's schema requires the field
         "onExitCodes": {"containerName": "node", "operator": "NotIn", "values": [0]}},
    ]
    assert "successPolicy" not in spec  # the dry run's: every supported version (node 0's end ends the job)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == "d" and "hostname" not in pod
    assert spec["template"]["metadata"]["labels"] == {"envpipe.io/job": "d", "envpipe.io/role": "node"}


def test_no_ssh_job_succeeds_when_every_node_does(capsys) -> None:
    spec = _docs(capsys, no_ssh=True)[-1]["spec"]
    assert "successPolicy" not in spec
    (c,) = spec["template"]["spec"]["containers"]
    assert c["args"][:3] == ["launcher", "bash", "-c"]
    assert "--no_ssh --node_rank=$$JOB_COMPLETION_INDEX " in c["args"][3]  # $$: the kubelet leaves one $ for bash
    assert "readinessProbe" not in c and not any(v["name"] == "ssh" for v in spec["template"]["spec"]["volumes"])


def test_queue_ttl_and_deadline_reach_the_workload(capsys) -> None:
    batch = Batch("job", queue="team-a", ttl_after_finished_s=600, active_deadline_s=7200)
    job = _docs(capsys, batch=batch)[-1]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True  # created suspended: Kueue unsuspends it once admitted
    assert job["spec"]["ttlSecondsAfterFinished"] == 600 and job["spec"]["activeDeadlineSeconds"] == 7200
    js = _docs(capsys, batch=Batch("jobset", queue="team-a", ttl_after_finished_s=600, active_deadline_s=7200))[-1]
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert js["spec"]["suspend"] is True and js["spec"]["ttlSecondsAfterFinished"] == 600
    (rjob,) = js["spec"]["replicatedJobs"]
    assert "kueue.x-k8s.io/queue-name" not in rjob["template"].get("metadata", {}).get("labels", {})
    assert rjob["template"]["spec"]["activeDeadlineSeconds"] == 7200


def test_the_jobset_wraps_the_same_indexed_job(capsys) -> None:
    job_docs, js_docs = _docs(capsys), _docs(capsys, workload="jobset")
    js = js_docs[-1]
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert js["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "d", "publishNotReadyAddresses": True}
    assert "failurePolicy" not in js["spec"]  # the first failed Job fails the JobSet
    (rjob,) = js["spec"]["replicatedJobs"]
    assert rjob["name"] == "node" and rjob["replicas"] == 1
    # the same Job spec (suspend and TTL are the JobSet's), apart from the host names in node 0's command
    # and the subdomain, which the JobSet controller sets
    job_spec = {k: v for k, v in job_docs[-1]["spec"].items() if k not in ("suspend", "ttlSecondsAfterFinished")}
    del job_spec["template"]["spec"]["subdomain"]
    js_spec = rjob["template"]["spec"]
    job_args, js_args = (s["template"]["spec"]["containers"][0].pop("args") for s in (job_spec, js_spec))

    def hosts(text: str) -> str:
        return text.replace("d-0.d", "d-node-0-0.d").replace("d-1.d", "d-node-0-1.d").replace("d-2.d", "d-node-0-2.d")

    job_env = job_spec["template"]["spec"]["containers"][0]["env"]
    job_spec["template"]["spec"]["containers"][0]["env"] = [{**e, "value": hosts(e["value"])} if "value" in e else e
                                                            for e in job_env]
    assert js_spec == job_spec
    assert js_args[3] == hosts(job_args[3])
    # the hosts are the Job controller's names of the JobSet's Job d-node-0
    assert js_docs[0]["data"]["hostfile"] == "".join(f"d-node-0-{i}.d slots=2\n" for i in range(3))


def test_dry_run_has_no_placeholders_and_no_key(capsys) -> None:
    """A GitOps user commits the dry run: it must hold no key (it printed a fresh private key before). The pods
    mount the Secret by name, and one line on stderr says how to make it; with --ssh-secret, the user's."""
    text = _text(capsys)
    docs = list(yaml.safe_load_all(text))
    assert not re.search(r"<[A-Za-z][^<>]*>", text) and "ownerReferences" not in text  # no "<job uid>"
    assert "PRIVATE KEY" not in text and "ssh-ed25519" not in text and "Secret" not in [d["kind"] for d in docs]
    assert docs[0]["data"]["hostfile"] == "".join(f"d-{i}.d slots=2\n" for i in range(3))
    assert docs[1]["spec"]["selector"] == {"envpipe.io/job": "d", "envpipe.io/role": "node"}
    (ssh,) = [v for v in _template(docs)["spec"]["volumes"] if v["name"] == "ssh"]
    assert ssh["secret"]["secretName"] == "d-ssh"
    assert kube.launch(_spec(), kube.KubeOptions(image="img:1", name="d", dry_run=True)) == 0
    err = capsys.readouterr().err
    assert "the pods mount Secret d-ssh, which these manifests do not hold (no key is printed)" in err
    assert "kubectl create secret generic d-ssh -n default --type=kubernetes.io/ssh-auth" in err
    theirs = _docs(capsys, ssh_secret="team-ssh")
    (ssh,) = [v for v in _template(theirs)["spec"]["volumes"] if v["name"] == "ssh"]
    assert ssh["secret"]["secretName"] == "team-ssh" and capsys.readouterr().err == ""


def test_node_zero_waits_for_every_sshd_then_runs_pdsh(capsys) -> None:
    (c,) = _template(_docs(capsys))["spec"]["containers"]
    mode, shell, flag, script = c["args"]
    assert (mode, shell, flag) == ("node", "bash", "-c")  # the image's entrypoint: sshd, and node 0 runs this
    wait, run = script.split("; exec deepspeed ")
    assert "for h in d-0.d d-1.d d-2.d; do until (exec 3<>/dev/tcp/$$h/2222)" in wait
    assert run.startswith("--hostfile /etc/envpipe/job/hostfile --master_addr d-0.d --master_port 29500 "
                          "--launcher pdsh --ssh_port 2222 --no_ssh_check --force_multi examples/train_gpt.py "
                          "--steps 5")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PDSH_SSH_ARGS_APPEND"].startswith("-o StrictHostKeyChecking=no")
    assert c["readinessProbe"] == {"tcpSocket": {"port": 2222}, "periodSeconds": 2}


def test_pods_pass_what_a_cluster_admin_checks(capsys) -> None:
    """Pod Security "restricted" field by field, apart from the clockd hostPath (documented exception)."""
    for workload in ("job", "jobset"):
        spec = _template(_docs(capsys, workload=workload))["spec"]
        ctx = spec["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 1000
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        (c,) = spec["containers"]
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                        "runAsNonRoot": True}
        assert c["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
        assert c["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}
        kinds = {next(k for k in v if k != "name") for v in spec["volumes"]}
        assert kinds == {"secret", "configMap", "emptyDir", "hostPath"}


def test_nodes_mount_the_socket_read_only_with_their_identity(capsys) -> None:
    spec = _template(_docs(capsys))["spec"]
    (c,) = spec["containers"]
    assert {"name": "clockd", "mountPath": "/run/envpipe", "readOnly": True} in c["volumeMounts"]
    assert {"name": "clockd", "hostPath": {"path": "/run/envpipe", "type": "DirectoryOrCreate"}} in spec["volumes"]
    assert spec["securityContext"]["supplementalGroups"] == [2500]
    env = {e["name"]: e for e in c["env"]}
    assert env["ENVPIPE_CLOCKD_SOCKET"]["value"] == "/run/envpipe/clockd.sock"
    for var, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                      ("POD_UID", "metadata.uid")):
        assert env[var]["valueFrom"] == {"fieldRef": {"fieldPath": path}}
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_scheduling_and_socket_options_reach_the_pods(capsys, tmp_path: Path) -> None:
    affinity = tmp_path / "affinity.yaml"
    affinity.write_text(
        "nodeAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    nodeSelectorTerms:\n"
        "    - matchExpressions: [{key: gpu.type, operator: In, values: [h200]}]\n"
    )
    pods = kube.pod_settings(kube.PodRequest(
        cpu=8, memory_gib=64, shm_gib=16, node_selector=("nvidia.com/gpu.present=true",),
        tolerations=("nvidia.com/gpu:NoSchedule", "team=ml:NoExecute", "spot"), affinity_file=str(affinity),
        image_pull_secrets=("regcred",), priority_class="training-high", clockd_dir="/var/run/clk/",
        clockd_gid=3100,
    ))
    for workload in ("job", "jobset"):
        docs = _docs(capsys, workload=workload, pods=pods)
        for d in docs:
            schemas.validate(d)
        spec = _template(docs)["spec"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
            {"key": "spot", "operator": "Exists"},
        ]
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert spec["containers"][0]["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
        assert spec["securityContext"]["supplementalGroups"] == [3100]
        assert {"name": "clockd", "hostPath": {"path": "/var/run/clk", "type": "DirectoryOrCreate"}} in spec["volumes"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["priorityClassName"] == "training-high"


def test_dollar_signs_reach_the_job_unexpanded(capsys) -> None:
    """The kubelet expands $(VAR) and $$ in args and env values: what the user wrote must survive it."""
    spec = JobSpec(nodes=1, gpus_per_node=1, script="t.py", script_args=["--tag", "$(HOME)-$$"], backend="kube",
                   env=["X=a$(B)"], script_on_workers=True)
    (c,) = _template(_docs(capsys, spec, no_ssh=True))["spec"]["containers"]
    assert c["args"][-1].endswith("--tag '$$(HOME)-$$$$'")
    assert {"name": "X", "value": "a$$(B)"} in c["env"]


def test_no_clockd_pods_mount_no_host_path(capsys) -> None:
    text = yaml.safe_dump_all(_docs(capsys, pods=kube.pod_settings(kube.PodRequest(no_clockd=True))))
    assert "hostPath" not in text and "ENVPIPE_CLOCKD_SOCKET" not in text and "supplementalGroups" not in text


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
        kube.pod_settings(kube.PodRequest(**opts))


def test_affinity_file_must_hold_affinity(tmp_path: Path) -> None:
    bad = tmp_path / "a.yaml"
    bad.write_text("nodeSelector: {a: b}\n")
    with pytest.raises(LaunchError, match="must hold a mapping of nodeAffinity, podAffinity, podAntiAffinity"):
        kube.pod_settings(kube.PodRequest(affinity_file=str(bad)))


NODE_TERM = "nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [%s]}}"
BAD_AFFINITIES = [
    ("nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {}}", "nodeSelectorTerms"),
    ("nodeAffinity: {requiredDuringScheduling: {nodeSelectorTerms: []}}", "nodeAffinity.requiredDuringScheduling"),
    (NODE_TERM % "{matchExpressions: [{key: gpu, operator: Bogus}]}", "operator: 'Bogus' is not one of"),
    (NODE_TERM % "{matchExpressions: [{key: gpu, operator: In, values: [1]}]}", "values"),
    (NODE_TERM % "{matchExpressions: [{key: gpu, operator: In, value: [a]}]}", "matchExpressions[0].value"),
    ("podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: '5', podAffinityTerm: "
     "{topologyKey: k}}]}", "weight"),
    ("podAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{labelSelector: {matchExpressions: "
     "[{key: a, operator: Gt, values: ['1']}]}, topologyKey: k}]}", "operator: 'Gt' is not one of"),
    ("nodeAffinity: x", "v1.NodeAffinity"),
]


@pytest.mark.parametrize(("text", "where"), BAD_AFFINITIES)
def test_an_affinity_the_official_schema_refuses_is_one_line(text: str, where: str, tmp_path: Path, capsys) -> None:
    """The old launcher checked only the top-level keys, and put any content into the pods: the manifest then
    failed the official schema (or the API server) after the launch began; each of these does."""
    path = tmp_path / "a.yaml"
    path.write_text(text + "\n")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "i"}], "affinity": yaml.safe_load(text)}}
    invalid = True
    try:
        schemas.validate(pod)
        invalid = False
    except schemas.Invalid:
        pass
    assert invalid or "operator" in where  # the schema has no enum for operators; the API server refuses them
    r = CliRunner().invoke(launch_main, ["--backend", "kube", "--image", "img:1", "--dry-run", "--affinity",
                                         str(path), "--", "t.py"])
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith(f"envpipe-launch: error: --affinity {path}: not a Kubernetes affinity: ")
    assert where in r.stderr


def test_an_affinity_file_is_read_with_bounds(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nnodeAffinity: *b\n")
    for path, message in [(bomb, "aliases"), ("/dev/zero", "not a regular file")]:
        with pytest.raises(LaunchError, match=message):
            kube.pod_settings(kube.PodRequest(affinity_file=str(path)))


def test_the_vendored_jobset_schema_refuses_what_the_api_server_would(capsys) -> None:
    js = _docs(capsys, workload="jobset")[-1]
    cases = [
        (("spec", "network"), "bogus", True, "spec.network: Additional properties are not allowed"),
        (("spec", "replicatedJobs", 0), "replicas", "1", "spec.replicatedJobs.0.replicas: '1' is not of type"),
        (("spec", "replicatedJobs", 0, "template", "spec", "template", "spec", "containers", 0), "bogus", 1,
         "containers.0: Additional properties are not allowed"),
        (("metadata", "labels"), "a", 1, "metadata.labels.a: 1 is not of type 'string'"),
    ]
    for path, key, value, message in cases:
        bad = yaml.safe_load(yaml.safe_dump(js))
        node = bad
        for part in path:
            node = node[part]
        node[key] = value
        with pytest.raises(schemas.Invalid, match=re.escape(message)):
            schemas.validate(bad)


def test_dry_run_is_accepted_by_kubectl_for_both_workloads(capsys, tmp_path: Path) -> None:
    """The real kubectl (the static one from the helm wheel) applies the dry run against the fake API
    server's discovery (which serves batch/v1 and jobset.x-k8s.io/v1alpha2); the kubernetes-validate
    CLI checks the Job's manifests strictly (it has no JobSet schema: tests/support/schemas has)."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        validator = Path(sys.executable).parent / "kubernetes-validate"
        runs = [("s", {}), ("n", {"no_ssh": True}), ("c", {"pods": kube.pod_settings(kube.PodRequest(no_clockd=True))}),
                ("q", {"batch": Batch("job", queue="team-a")}), ("js", {"workload": "jobset"}),
                ("jq", {"batch": Batch("jobset", queue="team-a"), "no_ssh": True})]
        for name, opts in runs:
            text = _text(capsys, name=name, **opts)  # "n": YAML 1.1 (kubectl) reads an unquoted n as false
            docs = list(yaml.safe_load_all(text))
            manifest = tmp_path / f"{name}.yaml"
            manifest.write_text(text)
            applied = subprocess.run(
                [str(find_kubectl()), "--kubeconfig", str(kubeconfig), "apply", "--dry-run=client",
                 "--validate=false", "-f", str(manifest)], capture_output=True, text=True,
            )
            assert applied.returncode == 0, applied.stderr
            kinds = {"JobSet": "jobset.jobset.x-k8s.io", "Job": "job.batch"}
            created = [f"{kinds.get(d['kind'], d['kind'].lower())}/{d['metadata']['name']} created (dry run)"
                       for d in docs]
            assert applied.stdout.splitlines() == created
            if docs[-1]["kind"] == "Job":
                for version in VERSIONS:  # the oldest supported Kubernetes, and the newest schema it knows
                    validated = subprocess.run([str(validator), "--strict", "-k", version, str(manifest)],
                                               capture_output=True, text=True)
                    assert validated.returncode == 0, validated.stdout + validated.stderr
        assert not any(api.names(p) for p in ("pods", "jobs", "jobsets", "services", "secrets", "configmaps"))
    finally:
        api.stop()

"""kube backend through the real `kubernetes` client over real HTTP against tests/support/fakes/kube_api.py,
whose Job, JobSet, TTL and Kueue controllers and kubelet run the workloads the launcher creates.

Every object the launcher or a controller sends is validated by the fake against the official schemas
and JobSet's CRD schema (tests/support/schemas); a 422 would fail the launch and show in `api.rejected`.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from envpipe_launch import sshkeys
from envpipe_launch.backends import kube
from envpipe_launch.errors import LaunchError, Stopped, handling, raise_stopped
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import Batch
from kubernetes import client

from tests.support.clockd_helpers import wait_for
from tests.support.fakes.kube_api import FakeKubeAPI
from tests.support.scheduling import bound_s

ROOT = Path(__file__).resolve().parents[2]
PLURALS = ("pods", "jobs", "jobsets", "services", "secrets", "configmaps")
WORKLOADS = ["job", "jobset"]
PLURAL = {"job": "jobs", "jobset": "jobsets"}


def _spec(nodes: int = 3, gpus: int = 2, **kw) -> JobSpec:
    return JobSpec(nodes=nodes, gpus_per_node=gpus, script="examples/train_gpt.py", script_args=["--steps", "5"],
                   backend="kube", script_on_workers=True, **kw).validate()


def _launch(fake: FakeKubeAPI, spec: JobSpec | None = None, workload: str = "job", **opts) -> int:
    opts.setdefault("image", "registry.example/envpipe-runtime:1")
    opts.setdefault("name", "t")
    opts.setdefault("ready_timeout_s", 20)
    opts.setdefault("batch", Batch(workload))
    options = kube.KubeOptions(**opts)
    return kube.run_job(kube.build_job(spec or _spec(), options), options, fake.client())


def _leftovers(fake: FakeKubeAPI) -> dict[str, list[str]]:
    return {p: fake.names(p) for p in PLURALS if fake.names(p)}


def _cli(fake: FakeKubeAPI, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
    return subprocess.Popen([sys.executable, "-m", "envpipe_launch", "--backend", "kube", "--image", "img:1",
                             "--name", "c", *args, "--", "train.py"], env=env, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_ssh_job_runs_on_node_zero_and_cleans_up(api: FakeKubeAPI, capsys, workload: str) -> None:
    assert _launch(api, workload=workload) == 0
    out = capsys.readouterr()
    host = "t" if workload == "job" else "t-node-0"
    # node 0's log: the hostfile of the nodes' DNS names under the headless Service, and DeepSpeed over pdsh
    assert [ln for ln in out.out.splitlines() if "slots=" in ln] == [f"{host}-{i}.t slots=2" for i in range(3)]
    assert f"exec deepspeed --hostfile /etc/envpipe/job/hostfile --master_addr {host}-0.t" in out.out
    assert "--launcher pdsh --ssh_port 2222" in out.out
    assert "nodes ready 3/3" in out.err and "nodes ready at 10.244." in out.err
    assert api.rejected == [] and _leftovers(api) == {}
    assert api.requests["GET pods watch"] >= 1  # readiness by watch
    assert api.requests[f"DELETE {PLURAL[workload]}/name"] == 1  # one delete: the owner references do the rest


@pytest.mark.parametrize("workload", WORKLOADS)
def test_exit_code_is_passed_through(api: FakeKubeAPI, capsys, workload: str) -> None:
    api.job_exit_code = 3
    assert _launch(api, workload=workload) == 3
    err = capsys.readouterr().err  # a JobSet's failure names its failed Job's, which names the pod
    assert "PodFailurePolicy: Container node for pod default/t" in err and "failed with exit code 3" in err
    assert _leftovers(api) == {}


def test_no_ssh_mode_runs_deepspeed_on_every_node(api: FakeKubeAPI, capsys) -> None:
    assert _launch(api, _spec(nodes=2), no_ssh=True) == 0
    out = capsys.readouterr().out
    assert "t-0.t slots=2" in out and "t-1.t slots=2" in out
    assert "--no_ssh --node_rank=$JOB_COMPLETION_INDEX " in out  # what bash gets, after the kubelet's $$ -> $
    assert _leftovers(api) == {} and api.rejected == []


def test_no_ssh_node_that_finishes_before_the_last_starts(api: FakeKubeAPI) -> None:
    api.run_s = 0  # node 0 ends while later nodes are still starting
    assert _launch(api, _spec(nodes=4), no_ssh=True) == 0
    assert _leftovers(api) == {}


def test_no_ssh_failure_of_one_node_fails_the_job_with_its_code(api: FakeKubeAPI, capsys) -> None:
    api.exit_codes = {1: 7}
    assert _launch(api, _spec(nodes=3), no_ssh=True) == 7
    err = capsys.readouterr().err
    assert "job t failed: PodFailurePolicy: Container node for pod default/t-1-" in err
    assert "failed with exit code 7 matching FailJob rule at index 1" in err
    assert _leftovers(api) == {}


def _in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_catch(fn, *args, **kwargs)), daemon=True)
    thread.start()
    return thread, result


def _catch(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except LaunchError as e:
        return e


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_drained_node_fails_the_whole_job_at_once(api: FakeKubeAPI, capsys, workload: str) -> None:
    """A node drain (the DisruptionTarget condition) on node 1 while node 0 trains: the Job fails at
    once by its podFailurePolicy, every other pod is deleted, and the launcher says why."""
    api.run_s = 60
    thread, result = _in_thread(_launch, api, workload=workload)
    wait_for(lambda: len(api.names("pods")) == 3 and all(
        p["status"]["phase"] == "Running" for p in api.items("pods", "default")), timeout=20)
    victim = next(p["metadata"]["name"] for p in api.items("pods", "default")
                  if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
    started = time.monotonic()
    api.call(api.disrupt("default", victim))
    thread.join(20)
    assert result == [143], result  # the disrupted pod's SIGTERM; node 0 had not ended
    assert time.monotonic() - started < bound_s(5.0)  # not after node 0's 60 s
    err = capsys.readouterr().err
    assert f"PodFailurePolicy: Pod default/{victim} has condition DisruptionTarget matching FailJob rule" in err
    assert _leftovers(api) == {}


def test_active_deadline_fails_a_job_that_runs_too_long(api: FakeKubeAPI, capsys) -> None:
    api.run_s = 60
    assert _launch(api, batch=Batch("job", active_deadline_s=1)) == 1
    assert "job t failed: DeadlineExceeded: Job was active longer than specified deadline" in capsys.readouterr().err
    assert _leftovers(api) == {}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_kept_job_is_owned_by_its_workload_and_goes_with_it(api: FakeKubeAPI, capsys, workload: str) -> None:
    assert _launch(api, workload=workload, keep=True, batch=Batch(workload, ttl_after_finished_s=3600)) == 0
    assert f"kubectl delete {workload} t -n default" in capsys.readouterr().err
    owner = api.get(PLURAL[workload], "default", "t")
    assert owner is not None
    uid = owner["metadata"]["uid"]
    for plural, name in (("secrets", "t-ssh"), ("configmaps", "t-config"), ("services", "t")):
        refs = api.get(plural, "default", name)["metadata"]["ownerReferences"]  # type: ignore[index]
        assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [(owner["kind"], uid, True)], plural
    client.CustomObjectsApi(api.client()).delete_namespaced_custom_object(  # like kubectl delete
        *(("batch", "v1") if workload == "job" else ("jobset.x-k8s.io", "v1alpha2")), "default", PLURAL[workload], "t")
    assert _leftovers(api) == {}


def test_a_finished_job_is_deleted_by_the_cluster_after_its_ttl(api: FakeKubeAPI) -> None:
    assert _launch(api, keep=True, batch=Batch("job", ttl_after_finished_s=1)) == 0
    assert api.names("jobs") == ["t"]
    wait_for(lambda: _leftovers(api) == {}, timeout=10)


@pytest.mark.slow  # ~5 s; the TTL's cleanup alone: test_a_finished_job_is_deleted_by_the_cluster_after_its_ttl
def test_a_sigkilled_launcher_leaves_nothing_the_cluster_does_not_clean(api: FakeKubeAPI, tmp_path: Path) -> None:
    """SIGKILL while node 0 trains: the job runs to its end, then its TTL and the owner references
    remove every object (here a 1 s TTL)."""
    api.run_s = 2
    proc = _cli(api, tmp_path, "--nodes", "2", "--ttl-after-finished", "1")
    wait_for(lambda: any(p["status"]["phase"] == "Running" and p["metadata"]["labels"][
        "batch.kubernetes.io/job-completion-index"] == "0" for p in api.items("pods", "default")), timeout=20)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert set(_leftovers(api)) == {"pods", "jobs", "services", "secrets", "configmaps"}
    wait_for(lambda: _leftovers(api) == {}, timeout=15)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_queued_job_waits_for_kueue_then_runs(api: FakeKubeAPI, capsys, workload: str) -> None:
    # the nodes run 2 s, not the fake's 20 ms: node 0 must not end before the launcher, back from waiting for
    # Kueue, lists the pods (it did once in CI under pytest-xdist, 2026-11-29: "pod t-0 ended early (Succeeded)")
    api.run_s = 2
    assert _launch(api, workload=workload, batch=Batch(workload, queue="team-a")) == 0
    err = capsys.readouterr().err
    assert "queued in Kueue LocalQueue team-a: waiting to be admitted" in err and "admitted by Kueue after" in err
    assert api.kueue.admitted == [f"{PLURAL[workload]}/t"]
    assert _leftovers(api) == {}


def test_a_job_no_queue_admits_starts_no_pod_and_ctrl_c_removes_it(api: FakeKubeAPI, tmp_path: Path) -> None:
    proc = _cli(api, tmp_path, "--nodes", "2", "--queue", "nobody-s-queue")
    wait_for(lambda: api.names("configmaps") == ["c-config"], timeout=20)
    time.sleep(0.5)  # time enough for a wrong start
    job = api.get("jobs", "default", "c")
    assert job is not None and job["spec"]["suspend"] is True and api.names("pods") == []
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "queued in Kueue LocalQueue nobody-s-queue" in err, err
    assert _leftovers(api) == {}


def test_image_pull_failure_is_reported_and_cleaned(api: FakeKubeAPI) -> None:
    with pytest.raises(LaunchError, match="ErrImagePull"):
        _launch(api, image="registry.example/does-not-exist:1")
    assert _leftovers(api) == {}


def test_quota_refusal_is_reported_and_cleaned(api: FakeKubeAPI) -> None:
    """The Job controller cannot create the third pod: the launcher's deadline ends the wait, naming
    the controller's FailedCreate event."""
    api.pod_quota, api.run_s = 2, 30  # node 0 trains until the test ends
    with pytest.raises(LaunchError, match=r"timed out after 1s: 2/3 nodes ready \(last warning: Job t: FailedCreate: "
                                          r"Error creating: pods \"t-2-\w+\" is forbidden: exceeded quota"):
        _launch(api, ready_timeout_s=1)
    assert _leftovers(api) == {}


def test_existing_names_are_a_clear_error_and_left_untouched(api: FakeKubeAPI) -> None:
    batch = client.BatchV1Api(api.client())
    theirs = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"},
              "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
                  {"name": "c", "image": "x"}]}}}}
    batch.create_namespaced_job("default", theirs)
    with pytest.raises(LaunchError, match=r"creating Job t: HTTP 409.*already exists"):
        _launch(api)
    assert _leftovers(api) == {"jobs": ["t"]} and api.get("jobs", "default", "t")["spec"]["template"]["spec"][  # type: ignore[index]
        "containers"][0]["image"] == "x"
    # a name taken by one of the objects the workload would own: the workload goes again, theirs stays
    core = client.CoreV1Api(api.client())
    core.create_namespaced_config_map("default", {"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": "u-config"}, "data": {"mine": "yes"}})
    with pytest.raises(LaunchError, match=r"creating ConfigMap u-config: HTTP 409.*already exists"):
        _launch(api, name="u")
    assert api.names("configmaps") == ["u-config"] and "u" not in api.names("jobs") and api.names("secrets") == []
    assert core.read_namespaced_config_map("u-config", "default").data == {"mine": "yes"}


def test_a_cluster_without_jobset_is_one_line_and_nothing_left() -> None:
    fake = FakeKubeAPI(jobset=False).start()
    try:
        with pytest.raises(LaunchError, match=r"^the cluster has no JobSet API \(jobset.x-k8s.io/v1alpha2\): "
                                              r"install JobSet, or use --workload job$"):
            _launch(fake, workload="jobset")
        assert _leftovers(fake) == {}
    finally:
        fake.stop()


def test_readiness_timeout_cleans_up(api: FakeKubeAPI) -> None:
    api.start_delay_s = 30
    with pytest.raises(LaunchError, match=r"timed out after 1s: 0/3 nodes ready$"):
        _launch(api, ready_timeout_s=1)
    assert _leftovers(api) == {}


@pytest.mark.parametrize(
    ("gpus", "opts", "message"),
    [
        (0, {}, "no GPUs requested"),
        (1, {"image": None}, "needs --image"),
        (1, {"cpu_only": True}, "--cpu conflicts"),
        (1, {"pods": kube.pod_settings(kube.PodRequest(shm_gib=16))},
         "--shm-size 16 GiB must be below --worker-memory 16 GiB"),
        (1, {"ssh_secret": "Bad_Name"}, "--ssh-secret 'Bad_Name' is not a Kubernetes object name"),
        (1, {"ssh_secret": "team-ssh", "no_ssh": True}, "--ssh-secret conflicts with --no-ssh"),
    ],
)
def test_bad_input_touches_nothing(api: FakeKubeAPI, gpus: int, opts: dict, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        _launch(api, _spec(gpus=gpus), **opts)
    assert sum(api.requests.values()) == 0


def test_env_reaches_every_node_through_deepspeeds_env_file(api: FakeKubeAPI, capsys) -> None:
    spec = JobSpec(nodes=2, gpus_per_node=1, script="s.py", backend="kube", env=["A=1", "B=x y"],
                   script_on_workers=True)
    assert _launch(api, spec, name="e") == 0
    assert "e-config/deepspeed_env:\nA=1\nB=x y\n" in capsys.readouterr().out


def test_cli_ctrl_c_cleans_up(api: FakeKubeAPI, tmp_path: Path) -> None:
    """The real CLI with a kubeconfig file; SIGINT while waiting for the nodes leaves nothing behind."""
    api.start_delay_s = 60
    proc = _cli(api, tmp_path, "--nodes", "2")
    wait_for(lambda: len(api.names("pods")) == 2, timeout=20)
    assert [n.rsplit("-", 1)[0] for n in api.names("pods")] == ["c-0", "c-1"]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert _leftovers(api) == {}


CREATED = {"job": ["jobs", "secrets", "configmaps", "services"], "jobset": ["jobsets", "secrets", "configmaps"]}
TRIALS = 10


@pytest.mark.parametrize("stage", ["received", "stored"])
@pytest.mark.parametrize(("workload", "plural"), [(w, p) for w in WORKLOADS for p in CREATED[w]])
def test_a_signal_while_a_create_request_is_in_flight_leaves_nothing(api: FakeKubeAPI, capsys, workload: str,
                                                                     plural: str, stage: str) -> None:
    """SIGINT to the launcher while the API server has each create request and its answer has not come back
    (before or after the object is stored), 10 times: the launcher deletes what it asked for (the old one
    knew of the workload only from the answer, and left a suspended Job, or a JobSet with its child Job and
    Service, that no TTL ever removes), and a name of someone else's object is left alone."""
    main = threading.main_thread().ident
    assert main is not None

    def interrupt(what: str, body: dict, when: str) -> None:
        if what == plural and when == stage and not sent:
            sent.append(body["metadata"]["name"])
            signal.pthread_kill(main, signal.SIGINT)  # the launcher's thread, blocked in the request

    api.on_create = interrupt
    for trial in range(TRIALS):
        sent: list[str] = []
        with pytest.raises(Stopped), handling(raise_stopped):
            _launch(api, workload=workload, name=f"t{trial}")
        assert sent and _leftovers(api) == {}, (trial, sent, _leftovers(api))
    assert "could not confirm" not in capsys.readouterr().err
    api.on_create = None
    # a name already taken: 409, and the other object stays
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "u-config", "namespace": "default"}}
    client.CoreV1Api(api.client()).create_namespaced_config_map("default", other)
    with pytest.raises(LaunchError, match="409"):
        _launch(api, workload=workload, name="u")
    assert _leftovers(api) == {"configmaps": ["u-config"]}


def test_keep_keeps_only_a_whole_job(api: FakeKubeAPI, capsys) -> None:
    """--keep: a job stopped before all of it exists is deleted all the same (suspended, it would never end)."""
    api.on_create = lambda plural, body, when: plural == "secrets" and signal.pthread_kill(
        threading.main_thread().ident or 0, signal.SIGINT)
    with pytest.raises(Stopped), handling(raise_stopped):
        _launch(api, keep=True)
    assert _leftovers(api) == {} and "kept" not in capsys.readouterr().err


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("version", ["1.27", "1.30"])
def test_before_1_31_node_zeros_end_ends_the_job_without_a_success_policy(capsys, workload: str,
                                                                           version: str) -> None:
    """The API server drops a Job's successPolicy before 1.31 (the fake does as it does): the launcher asks the
    version and leaves the field out, and the other nodes, which only serve ssh, end once node 0 has. Before,
    the field was sent, dropped, and the job held its GPUs until the deadline (here 20 s) failed it."""
    fake = FakeKubeAPI(version=version).start()
    try:
        batch = Batch(workload, active_deadline_s=20, ttl_after_finished_s=3600)
        assert _launch(fake, workload=workload, batch=batch, keep=True) == 0
        job = fake.get("jobs", "default", "t" if workload == "job" else "t-node-0")
        assert job is not None and "successPolicy" not in job["spec"]  # (a JobSet has its own, of its Jobs)
        err = capsys.readouterr().err
        assert f"(Kubernetes {version}: no Job successPolicy, the other nodes end with node 0)" in err
        pods = [fake.get("pods", "default", n) for n in fake.names("pods")]
        assert sorted(p["status"]["phase"] for p in pods if p) == ["Succeeded"] * 3  # every node ended, exit 0
        assert fake.rejected == []
    finally:
        fake.stop()


def test_from_1_31_node_zeros_success_ends_the_job_through_its_success_policy(api: FakeKubeAPI, capsys) -> None:
    assert api.version >= "1.31"
    assert _launch(api, keep=True, batch=Batch("job", ttl_after_finished_s=3600)) == 0
    job = api.get("jobs", "default", "t")
    assert job is not None and job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    assert [c["reason"] for c in job["status"]["conditions"] if c["type"] == "Complete"] == ["SuccessPolicy"]
    assert f"(Kubernetes {api.version})" in capsys.readouterr().err


def test_a_cluster_older_than_supported_is_one_line_and_nothing_made() -> None:
    fake = FakeKubeAPI(version="1.26").start()
    try:
        with pytest.raises(LaunchError, match=r"^the cluster runs Kubernetes 1.26; the kube backend needs 1.27 or "
                                              r"later"):
            _launch(fake)
        assert _leftovers(fake) == {} and sum(fake.requests.values()) == 0  # (/version is not counted)
    finally:
        fake.stop()


def test_the_launcher_makes_the_jobs_own_ssh_secret_and_mounts_a_named_one_instead(api: FakeKubeAPI) -> None:
    core = client.CoreV1Api(api.client())
    assert _launch(api, keep=True, batch=Batch("job", ttl_after_finished_s=3600)) == 0
    own = core.read_namespaced_secret("t-ssh", "default")
    assert base64.b64decode(own.data["ssh-privatekey"]).startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    keys = sshkeys.generate()
    core.create_namespaced_secret("default", {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
                                              "metadata": {"name": "team-ssh"},
                                              "stringData": {"ssh-privatekey": keys.private,
                                                             "authorized_keys": keys.public}})
    assert _launch(api, name="u", ssh_secret="team-ssh") == 0
    assert "u-ssh" not in api.names("secrets") and "team-ssh" in api.names("secrets")  # used, not made or deleted


@pytest.mark.parametrize(
    ("data", "message"),
    [(None, r"--ssh-secret team-ssh: no Secret team-ssh in namespace default"),
     ({"ssh-privatekey": "a2V5"}, r"--ssh-secret team-ssh: the Secret has no authorized_keys")],
)
def test_a_named_ssh_secret_that_will_not_do_is_one_line_before_anything_is_made(
        api: FakeKubeAPI, data: dict | None, message: str) -> None:
    if data is not None:
        client.CoreV1Api(api.client()).create_namespaced_secret(
            "default", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "team-ssh"}, "data": data})
    with pytest.raises(LaunchError, match=message):
        _launch(api, ssh_secret="team-ssh")
    assert set(_leftovers(api)) <= {"secrets"} and api.names("secrets") == ([] if data is None else ["team-ssh"])

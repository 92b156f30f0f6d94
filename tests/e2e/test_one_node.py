"""One host as one Kubernetes node, in real containers: both images built with podman, the clockd
DaemonSet pod exactly as `helm template` renders the chart (sim backend: no GPU here), and the two pods
of envpipe-launch's kube job exactly as the Job controller makes them from the Indexed Job that the
kube backend builds (tests/support/fakes/kube_controllers.pod_for_index): node 1 serves ssh, node 0
serves ssh and, as the job's launcher, runs `deepspeed --launcher pdsh` over both nodes' DNS names,
training a 2-node CPU job with the `daemon` clock.

What is not real: no kubelet, scheduler, API server or CoreDNS (tests/e2e/node.py runs the pod objects
with podman the way a kubelet would, and /etc/hosts entries stand for the pods' names under the job's
headless Service), simulated GPUs in clockd, and ENVPIPE_GPU_UUID standing in for the NVIDIA device
plugin's assignment of one GPU to each pod.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from envpipe_launch import sshkeys
from envpipe_launch.backends.kube import PodRequest, pod_settings
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import KubeJob

from benchmarks.clockd_study.harness import call
from envpipe.runtime.summary import RunSummary
from tests.e2e import images as image_build
from tests.e2e.node import Node
from tests.e2e.podman import Podman, Stopwatch, unavailable
from tests.support.fakes.kube_controllers import pod_for_index

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from helm_binary import find_helm  # noqa: E402

REASON = unavailable()
if REASON:
    pytest.skip(f"e2e: podman cannot run here: {REASON}", allow_module_level=True)

NETWORK = "envpipe-e2e"
METRICS_PORT = 9464
REPORT_DIR = "/tmp/envpipe-report"
# A tiny GPT on CPU: calibrate, profile two clocks, plan (the runtime's default policy), steady steps.
TRAIN = ["/opt/envpipe/examples/train_gpt.py", "--tiny", "--steps", "14", "--calibration-steps", "1",
         "--profile-points", "2", "--reconfigure-rounds", "2", "--compare-iterations", "1", "--report-dir", REPORT_DIR]
JOB_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0", "ENVPIPE_CLOCK": "daemon"}
Obj = dict[str, Any]


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    keep = os.environ.get("ENVPIPE_E2E_KEEP") == "1"  # reuse images across runs while developing
    workdir = Path(os.environ.get("ENVPIPE_E2E_DIR") or tempfile.mkdtemp(prefix="envpipe-e2e-"))
    engine = Podman(workdir, storage=os.environ.get("ENVPIPE_E2E_STORAGE", "overlay"))
    yield engine
    engine.close(keep_images=keep)


@pytest.fixture(scope="session")
def images(podman: Podman, stopwatch: Stopwatch) -> image_build.Images:
    return image_build.build(podman, stopwatch)


def chart_clockd_pod() -> Obj:
    """The DaemonSet's pod as the chart renders it for a node without GPUs."""
    result = subprocess.run(
        [str(find_helm()), "template", "clockd", str(ROOT / "charts/envpipe-clockd"), "--namespace", "gpu-system",
         "--set", "backend=sim", "--set", "ownership=local", "--set", "extraArgs={--sim-gpus=2}",
         "--set", f"metrics.port={METRICS_PORT}"],
        capture_output=True, text=True, check=True,
    )
    ds = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DaemonSet")
    return {"metadata": {"name": "clockd", "namespace": "gpu-system"}, "spec": ds["spec"]["template"]["spec"]}


@dataclass
class OneNode:
    node: Node
    job: KubeJob
    workload: Obj  # the Job as the API server stores it (uid, namespace)
    socket: Path  # the clockd socket on the host
    gpus: list[str]  # sim GPU UUIDs; node i got gpus[i]
    image: str  # the runtime image

    def audit(self) -> list[Obj]:
        logs = self.node.podman.run("logs", "clockd").stderr
        return [json.loads(line.split(" INFO ", 1)[1]) for line in logs.splitlines() if "clockd.audit INFO" in line]

    def gpu(self, uuid: str) -> Obj:
        status, body = call(str(self.socket), "GET", f"/v1/gpus/{uuid}")
        assert status == 200, body
        return body

    def start_node(self, index: int) -> str:
        """Node `index`'s pod as the Job controller makes it, with its GPU; its container's name."""
        pod = pod_for_index(self.workload, index)
        self.node.start(pod, self.image, extra_env={"ENVPIPE_GPU_UUID": self.gpus[index]})
        return str(pod["metadata"]["name"])

    def containers(self, index: int, every: bool = False) -> list[str]:
        """Node `index`'s containers, running ones (or every one)."""
        listed = self.node.podman.run("ps", *(["-a"] if every else []), "--format", "{{.Names}}").stdout.split()
        return [c for c in listed if c.startswith(f"j-{index}-")]

    def serving_node1(self) -> str:
        """Node 1 serving ssh: the one running, or a new one where the last ended with its node 0."""
        if running := self.containers(1):
            return running[0]
        for old in self.containers(1, every=True):
            self.node.podman.run("rm", old)
        name = self.start_node(1)
        ip = self.node.podman.ip(name, NETWORK)
        _wait(lambda: _port_open(ip, 2222), 60, f"sshd of node 1 on {ip}:2222")
        return name


def _wait(pred: Any, timeout: float, what: str, poll: float = 0.2) -> float:
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - start


def _answers(sock: Path) -> bool:
    try:
        return call(str(sock), "GET", "/healthz")[0] == 200
    except OSError:
        return False


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def one_node(podman: Podman, images: image_build.Images, stopwatch: Stopwatch) -> Iterator[OneNode]:
    node = Node(podman, NETWORK)
    try:
        with stopwatch.lap("start clockd and node 1"):
            clockd = chart_clockd_pod()
            node.start(clockd, images.clockd)
            args = next(c for c in clockd["spec"]["containers"] if c["name"] == "clockd")["args"]
            sock = node.host_path(next(a.split("=", 1)[1] for a in args if a.startswith("--socket=")))
            _wait(lambda: _answers(sock), 30, f"clockd on {sock}")
            status, listing = call(str(sock), "GET", "/v1/gpus")
            assert status == 200, listing
            gpus = [g["uuid"] for g in listing["gpus"]]
            spec = JobSpec(nodes=2, gpus_per_node=1, script=TRAIN[0], script_args=TRAIN[1:], backend="kube",
                           env=[f"{k}={v}" for k, v in JOB_ENV.items()], script_on_workers=True)
            pods = pod_settings(PodRequest(cpu=2, memory_gib=3, shm_gib=1))
            job = KubeJob(spec, "j", "team", images.runtime, pods=pods, worker_wait_s=120)
            keys = sshkeys.generate()
            for obj in job.dependents(keys):
                if obj["kind"] in ("Secret", "ConfigMap"):
                    node.add_object(obj)
            node.dns(*job.hosts())  # the headless Service's names of both nodes
            workload = job.workload(suspend=False)
            workload["metadata"]["uid"] = "00000000-0000-4000-8000-000000000001"
            one = OneNode(node, job, workload, sock, gpus, images.runtime)
            one.serving_node1()  # node 1 serves ssh; node 0 (the launcher) starts in the tests
        yield one
    finally:
        for line in podman.run("logs", "clockd", check=False).stderr.splitlines()[-5:]:
            print(f"clockd: {line}")


def test_clockd_runs_with_the_charts_settings(one_node: OneNode) -> None:
    st = one_node.socket.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 2500, 0o660)
    inspect = json.loads(one_node.node.podman.run("inspect", "clockd").stdout)[0]
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    assert inspect["Config"]["User"] == "0:2500"
    assert inspect["EffectiveCaps"] in (None, [])  # sim backend: every capability dropped


def test_worker_reaches_clockd_through_a_read_only_mount(one_node: OneNode) -> None:
    podman = one_node.node.podman
    w0 = one_node.serving_node1()
    probe = ("import os, socket; s = socket.socket(socket.AF_UNIX); s.connect(os.environ['ENVPIPE_CLOCKD_SOCKET']);"
             " s.sendall(b'GET /healthz HTTP/1.0\\r\\n\\r\\n'); print(s.recv(200).split()[1].decode(), os.getuid())")
    out = podman.run("exec", w0, "/opt/venv/bin/python", "-c", probe).stdout.split()
    assert out == ["200", "1000"]
    removed = podman.run("exec", w0, "rm", "-f", "/run/envpipe/clockd.sock", check=False)
    assert removed.returncode != 0 and "Read-only file system" in removed.stderr
    assert one_node.socket.exists()


def test_a_container_without_the_socket_group_is_refused(one_node: OneNode, images: image_build.Images) -> None:
    """The mode is what protects the GPUs: uid 1000 without group 2500 (the clockd image has no such
    user) gets Permission denied."""
    probe = "import socket; socket.socket(socket.AF_UNIX).connect('/run/envpipe/clockd.sock')"
    result = one_node.node.podman.run(
        "run", "--rm", "--user", "1000:1000", "--entrypoint", "python", "-v",
        f"{one_node.socket.parent}:/run/envpipe:ro", images.clockd, "-c", probe, check=False,
    )
    assert result.returncode != 0 and "PermissionError" in result.stderr


def test_two_node_training_with_the_daemon_clock(one_node: OneNode, stopwatch: Stopwatch) -> None:
    """Node 0 of the kube job as built: its sshd, the wait for both nodes' sshd by DNS name, DeepSpeed's
    pdsh launcher over the hostfile and env file of the job's ConfigMap, the ssh key of its Secret."""
    podman = one_node.node.podman
    node1 = one_node.serving_node1()
    with stopwatch.lap("node 0 of the kube job: 2-node training"):
        name = one_node.start_node(0)
        code = podman.run("wait", name, timeout=600).stdout.strip()
    logs = podman.run("logs", name).stdout + podman.run("logs", name).stderr
    assert code == "0", logs[-4000:]
    # node 0 has ended, so node 1, which only serves ssh, ends too, with status 0 (the entrypoint was told where
    # node 0 is): what completes the Job where the cluster has no Job successPolicy (Kubernetes before 1.31)
    with stopwatch.lap("node 1 ends after node 0"):
        assert podman.run("wait", node1, timeout=120).stdout.strip() == "0"
    audit = one_node.audit()
    opened = [e for e in audit if e["event"] == "lease_open"]
    for i, gpu in enumerate(one_node.gpus):  # each node leased its own GPU, as uid 1000 of its pod
        owners = [e["owner"] for e in opened if e["gpus"] == [gpu]]
        assert owners and all("uid=1000" in o and f"pod=team/j-{i}-" in o for o in owners), opened
    copied = one_node.node.podman.dir / "summary.json"  # node 0 has ended: copy out of its container
    podman.run("cp", f"{name}:{REPORT_DIR}/summary.json", str(copied))
    podman.run("rm", name)  # its host name j-0 is free for the next test's node 0
    summary = RunSummary.from_json(json.loads(copied.read_text()))
    assert summary.clock.kind == "daemon" and summary.clock.controls_clocks and summary.clock.refusals == []
    assert summary.plan is not None and summary.plan.clocks is not None and summary.plan.deployed
    for stage, gpu in enumerate(one_node.gpus):  # rank s (stage s) runs on worker s
        locked = {e["mhz"] for e in audit if e["event"] == "clock_lock" and e["gpu"] == gpu}
        asked = set(summary.plan.clocks[stage])
        assert asked <= locked, f"stage {stage}: report {sorted(asked)}, clockd locked {sorted(locked)}"
    assert all(not one_node.gpu(g)["lease_held"] and one_node.gpu(g)["locked"] is None for g in one_node.gpus)


def test_killing_a_training_container_resets_its_gpu_within_a_second(one_node: OneNode, stopwatch: Stopwatch) -> None:
    podman, gpu = one_node.node.podman, one_node.gpus[1]
    node1 = one_node.serving_node1()  # the last test's node 1 ended with its node 0
    one_node.start_node(0)
    resets_before = len([e for e in one_node.audit() if e["event"] == "clock_reset" and e["gpu"] == gpu])
    _wait(lambda: one_node.gpu(gpu)["locked"] is not None, 240, f"a clock lock on {gpu}", poll=0.05)
    podman.run("kill", "--signal", "KILL", node1)
    killed = time.monotonic()
    _wait(lambda: one_node.gpu(gpu)["locked"] is None and not one_node.gpu(gpu)["lease_held"], 5,
          f"the reset of {gpu}", poll=0.01)
    took = time.monotonic() - killed
    stopwatch.record("GPU reset after SIGKILL of its container", took)
    assert took < 1.0, f"GPU reset {took:.2f}s after the kill"
    resets = [e for e in one_node.audit() if e["event"] == "clock_reset" and e["gpu"] == gpu]
    assert len(resets) > resets_before, resets

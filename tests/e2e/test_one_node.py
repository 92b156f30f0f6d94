"""One host as one Kubernetes node, in real containers: both images built with podman, the clockd
DaemonSet pod exactly as `helm template` renders the chart (sim backend: no GPU here), two worker pods
and the launcher pod exactly as envpipe-launch's kube backend builds them, and `envpipe-launch
--backend ssh` training a 2-node CPU job across the workers with the `daemon` clock.

What is not real: no kubelet, scheduler or API server (tests/e2e/node.py runs the pod objects with
podman the way a kubelet would), simulated GPUs in clockd, and ENVPIPE_GPU_UUID standing in for the
NVIDIA device plugin's assignment of one GPU to each worker pod.
"""

from __future__ import annotations

import json
import os
import shlex
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
from envpipe_launch.backends.kube import _ssh_keypair, pod_settings
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import KubeJob
from envpipe_launch.kube_syntax import escape_expansion

from envpipe.runtime.summary import RunSummary
from tests.e2e import images as image_build
from tests.e2e.node import Node
from tests.e2e.podman import Podman, Stopwatch, unavailable
from tests.support.clockd_helpers import call

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
TRAIN = ["examples/train_gpt.py", "--tiny", "--steps", "14", "--calibration-steps", "1", "--profile-points", "2",
         "--reconfigure-rounds", "2", "--compare-iterations", "1", "--report-dir", REPORT_DIR]
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
    socket: Path  # the clockd socket on the host
    gpus: list[str]  # sim GPU UUIDs; worker i got gpus[i]
    image: str  # the runtime image

    def audit(self) -> list[Obj]:
        logs = self.node.podman.run("logs", "clockd").stderr
        return [json.loads(line.split(" INFO ", 1)[1]) for line in logs.splitlines() if "clockd.audit INFO" in line]

    def gpu(self, uuid: str) -> Obj:
        status, body = call(str(self.socket), "GET", f"/v1/gpus/{uuid}")
        assert status == 200, body
        return body

    def start_launcher(self, name: str) -> str:
        """The launcher pod of the kube backend, running `envpipe-launch --backend ssh` across the workers."""
        pod = self.job.launcher_pod()
        pod["metadata"]["name"] = name
        ips = ",".join(self.node.podman.ip(self.job.worker(i), NETWORK) for i in range(2))
        env = [a for k, v in JOB_ENV.items() for a in ("--env", f"{k}={v}")]
        launch = ["envpipe-launch", "--backend", "ssh", "--hosts", ips, "--nodes", "2", "--gpus-per-node", "1",
                  "--ssh-key", "/home/envpipe/.ssh/id_ed25519", *env, "--", *TRAIN]
        script = escape_expansion(f"cd /opt/envpipe && {shlex.join(launch)}")  # as the builders write args
        pod["spec"]["containers"][0]["args"] = ["launcher", "bash", "-c", script]
        return self.node.start(pod, self.image)[0]


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
        with stopwatch.lap("start clockd and two workers"):
            clockd = chart_clockd_pod()
            node.start(clockd, images.clockd)
            args = next(c for c in clockd["spec"]["containers"] if c["name"] == "clockd")["args"]
            sock = node.host_path(next(a.split("=", 1)[1] for a in args if a.startswith("--socket=")))
            _wait(lambda: _answers(sock), 30, f"clockd on {sock}")
            status, listing = call(str(sock), "GET", "/v1/gpus")
            assert status == 200, listing
            gpus = [g["uuid"] for g in listing["gpus"]]
            spec = JobSpec(nodes=2, gpus_per_node=1, script=TRAIN[0], script_args=TRAIN[1:], backend="kube",
                           script_on_workers=True)
            job = KubeJob(spec, "j", "team", images.runtime, pods=pod_settings(cpu=2, memory_gib=3, shm_gib=1))
            for obj in job.objects(*_ssh_keypair()):
                if obj["kind"] in ("Secret", "ConfigMap"):
                    node.add_object(obj)
            for i in range(2):  # the device plugin's part: one GPU per worker pod
                node.start(job.worker_pod(i), images.runtime, extra_env={"ENVPIPE_GPU_UUID": gpus[i]})
            for i in range(2):
                ip = podman.ip(job.worker(i), NETWORK)
                _wait(lambda ip=ip: _port_open(ip, 2222), 60, f"sshd of worker {i} on {ip}:2222")
        yield OneNode(node, job, sock, gpus, images.runtime)
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
    podman, w0 = one_node.node.podman, one_node.job.worker(0)
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
    podman = one_node.node.podman
    with stopwatch.lap("envpipe-launch --backend ssh: 2-node job"):
        name = one_node.start_launcher("j-launcher")
        code = podman.run("wait", name, timeout=600).stdout.strip()
    logs = podman.run("logs", name).stdout + podman.run("logs", name).stderr
    assert code == "0", logs[-4000:]
    audit = one_node.audit()
    opened = [e for e in audit if e["event"] == "lease_open"]
    for i, gpu in enumerate(one_node.gpus):  # each worker leased its own GPU, as uid 1000 of its pod
        owners = [e["owner"] for e in opened if e["gpus"] == [gpu]]
        assert owners and all("uid=1000" in o and f"pod=team/j-worker-{i}" in o for o in owners), opened
    text = podman.run("exec", one_node.job.worker(0), "cat", f"{REPORT_DIR}/summary.json").stdout
    summary = RunSummary.from_json(json.loads(text))
    assert summary.clock.kind == "daemon" and summary.clock.controls_clocks and summary.clock.refusals == []
    assert summary.plan is not None and summary.plan.clocks is not None and summary.plan.deployed
    for stage, gpu in enumerate(one_node.gpus):  # rank s (stage s) runs on worker s
        locked = {e["mhz"] for e in audit if e["event"] == "clock_lock" and e["gpu"] == gpu}
        asked = set(summary.plan.clocks[stage])
        assert asked <= locked, f"stage {stage}: report {sorted(asked)}, clockd locked {sorted(locked)}"
    assert all(not one_node.gpu(g)["lease_held"] and one_node.gpu(g)["locked"] is None for g in one_node.gpus)


def test_killing_a_training_container_resets_its_gpu_within_a_second(one_node: OneNode, stopwatch: Stopwatch) -> None:
    podman, gpu = one_node.node.podman, one_node.gpus[1]
    one_node.start_launcher("j-launcher-2")
    resets_before = len([e for e in one_node.audit() if e["event"] == "clock_reset" and e["gpu"] == gpu])
    _wait(lambda: one_node.gpu(gpu)["locked"] is not None, 240, f"a clock lock on {gpu}", poll=0.05)
    podman.run("kill", "--signal", "KILL", one_node.job.worker(1))
    killed = time.monotonic()
    _wait(lambda: one_node.gpu(gpu)["locked"] is None and not one_node.gpu(gpu)["lease_held"], 5,
          f"the reset of {gpu}", poll=0.01)
    took = time.monotonic() - killed
    stopwatch.record("GPU reset after SIGKILL of its container", took)
    assert took < 1.0, f"GPU reset {took:.2f}s after the kill"
    resets = [e for e in one_node.audit() if e["event"] == "clock_reset" and e["gpu"] == gpu]
    assert len(resets) > resets_before, resets

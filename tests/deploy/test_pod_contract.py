"""The contract between the envpipe-clockd chart, the runtime image and the launcher's pods.

launcher/envpipe_launch/pod_contract.py is the one source of the defaults; these tests compare it
with the chart's values, the Dockerfile and envpipe.clock, and render the chart with the real helm to
check that the socket it creates is the one the launcher's worker pods can reach.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from envpipe_launch.backends import kube
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import KubeJob
from envpipe_launch.pod_contract import RUNTIME_GID, RUNTIME_UID, ClockdSocket

from envpipe.clock.protocol import DEFAULT_SOCKET

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "envpipe-clockd"
sys.path.insert(0, str(ROOT / "tools"))
from helm_binary import find_helm  # noqa: E402

Obj = dict[str, Any]


def chart_daemonset(*sets: str) -> Obj:
    args = [str(find_helm()), "template", "clockd", str(CHART), "--namespace", "gpu-system"]
    for item in sets:
        args += ["--set", item]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "DaemonSet")


def node_pod(**options: Any) -> Obj:
    """The pod template of the launcher's Job: every node (node 0, the launcher, included) uses a GPU."""
    spec = JobSpec(nodes=2, gpus_per_node=1, script="train.py", backend="kube", script_on_workers=True)
    return KubeJob(spec, "j", "team", "img:1", pods=kube.pod_settings(kube.PodRequest(**options))).pod_template()


def mismatches(daemonset: Obj, worker: Obj) -> list[str]:
    """Every way in which a worker pod would not reach the socket that the chart's daemon creates."""
    ds = daemonset["spec"]["template"]["spec"]
    clockd = next(c for c in ds["containers"] if c["name"] == "clockd")
    args = dict(a.removeprefix("--").split("=", 1) for a in clockd["args"] if "=" in a)
    socket_dir = next(v["hostPath"]["path"] for v in ds["volumes"] if v["name"] == "socket-dir")
    gid = clockd["securityContext"]["runAsGroup"]
    mode = int(args["socket-mode"], 8)
    problems = []
    if mode & 0o060 != 0o060:
        problems.append(f"socket mode {mode:o} gives its group no read-write access")
    wspec = worker["spec"]
    (wc,) = wspec["containers"]
    mounts = {m["name"]: m for m in wc["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in wspec["volumes"] if "hostPath" in v}
    if host_paths.get("clockd") != socket_dir:
        problems.append(f"worker mounts hostPath {host_paths.get('clockd')}, the daemon serves {socket_dir}")
    elif mounts["clockd"].get("readOnly") is not True:
        problems.append("worker mounts the socket directory writable")
    env = {e["name"]: e.get("value") for e in wc["env"]}
    socket_in_pod = f"{mounts['clockd']['mountPath']}/{Path(args['socket']).name}" if "clockd" in mounts else None
    if env.get("ENVPIPE_CLOCKD_SOCKET") != args["socket"] or socket_in_pod != args["socket"]:
        problems.append(f"worker looks for {env.get('ENVPIPE_CLOCKD_SOCKET')}, the daemon listens on {args['socket']}")
    if gid not in wspec["securityContext"].get("supplementalGroups", []):
        problems.append(f"worker lacks the socket's group {gid} in supplementalGroups")
    if wspec["securityContext"]["runAsUser"] == 0:
        problems.append("worker runs as root")
    return problems


def test_defaults_match_the_chart_the_image_and_the_client() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["socket"]
    default = ClockdSocket()
    assert (values["hostDir"], values["name"], values["gid"], int(values["mode"], 8)) == (
        default.host_dir, default.name, default.gid, default.mode)
    assert default.path == DEFAULT_SOCKET
    dockerfile = (ROOT / "images" / "runtime" / "Dockerfile").read_text()
    assert re.search(rf"^ARG CLOCKD_GID={default.gid}$", dockerfile, flags=re.M)
    assert re.search(rf"^USER {RUNTIME_UID}:{RUNTIME_GID}$", dockerfile, flags=re.M)
    assert f"--uid {RUNTIME_UID} --gid {RUNTIME_GID} --groups envpipe-clock" in dockerfile


def test_default_chart_and_default_launcher_pods_fit() -> None:
    assert mismatches(chart_daemonset(), node_pod()) == []


def test_non_default_socket_fits_when_both_sides_say_so() -> None:
    ds = chart_daemonset("socket.gid=3100", "socket.hostDir=/var/run/clk", "socket.name=c.sock")
    # the launcher knows no socket name option: a renamed socket must be reported
    assert mismatches(ds, node_pod(clockd_dir="/var/run/clk", clockd_gid=3100)) == [
        "worker looks for /var/run/clk/clockd.sock, the daemon listens on /var/run/clk/c.sock"
    ]
    ds = chart_daemonset("socket.gid=3100", "socket.hostDir=/var/run/clk")
    assert mismatches(ds, node_pod(clockd_dir="/var/run/clk", clockd_gid=3100)) == []


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (("socket.gid=3100",), "worker lacks the socket's group 3100 in supplementalGroups"),
        (("socket.hostDir=/var/run/clk",), "worker mounts hostPath /run/envpipe, the daemon serves /var/run/clk"),
    ],
)
def test_a_chart_change_alone_is_caught(sets: tuple[str, ...], expected: str) -> None:
    assert expected in mismatches(chart_daemonset(*sets), node_pod())


def test_writable_or_rootful_worker_is_caught() -> None:
    worker = node_pod()
    next(m for m in worker["spec"]["containers"][0]["volumeMounts"] if m["name"] == "clockd")["readOnly"] = False
    worker["spec"]["securityContext"]["runAsUser"] = 0
    assert mismatches(chart_daemonset(), worker) == [
        "worker mounts the socket directory writable",
        "worker runs as root",
    ]

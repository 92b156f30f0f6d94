"""charts/envpipe-clockd rendered by the real helm binary, linted, and every object validated against
the official Kubernetes JSON schemas of two Kubernetes versions (kubernetes-validate, offline)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from envpipe.clock.protocol import DEFAULT_SOCKET

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "envpipe-clockd"
KUBE_VERSIONS = ("1.30.0", "1.35.0")

sys.path.insert(0, str(ROOT / "tools"))
from helm_binary import HelmNotFound, find_helm  # noqa: E402


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return find_helm()
    except HelmNotFound as exc:
        pytest.fail(f"no helm binary: {exc}")


def render(helm: Path, *sets: str, kube_version: str = KUBE_VERSIONS[-1], flag: str = "--set"
           ) -> subprocess.CompletedProcess[str]:
    args = [str(helm), "template", "clockd", str(CHART), "--namespace", "gpu-system",
            "--kube-version", kube_version]
    for item in sets:
        args += [flag, item]
    return subprocess.run(args, capture_output=True, text=True)


def objects(helm: Path, *sets: str, kube_version: str = KUBE_VERSIONS[-1], flag: str = "--set"
            ) -> dict[str, dict[str, Any]]:
    result = render(helm, *sets, kube_version=kube_version, flag=flag)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return {d["kind"]: d for d in docs}


def pod_spec(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objs["DaemonSet"]["spec"]["template"]["spec"]


def container(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The daemon's container (the reset guard runs beside it)."""
    return next(c for c in pod_spec(objs)["containers"] if c["name"] == "clockd")


def volumes_and_mounts(objs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's volumes and the daemon container's mounts, by name."""
    return ({v["name"]: v for v in pod_spec(objs)["volumes"]},
            {m["name"]: m for m in container(objs)["volumeMounts"]})


def test_helm_lint(helm: Path) -> None:
    result = subprocess.run([str(helm), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize(
    "sets",
    [(), ("backend=readonly", "ownership=local", "runtimeClassName=nvidia"),
     ("metrics.serviceMonitor.enabled=true", "serviceAccount.create=false", "metrics.grafanaDashboard.enabled=true")],
)
def test_objects_match_official_schemas(helm: Path, kube_version: str, sets: tuple[str, ...]) -> None:
    objs = objects(helm, *sets, kube_version=kube_version)
    for kind, obj in objs.items():
        if kind == "ServiceMonitor":  # a Prometheus Operator CRD: not in the Kubernetes schemas
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(obj, kube_version, strict=True)
            continue
        kubernetes_validate.validate(obj, kube_version, strict=True)


def test_schema_validation_can_fail() -> None:
    bad = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
           "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "ports": [
               {"containerPort": "metrics"}]}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSIONS[-1], strict=True)


def test_runs_on_gpu_nodes_only(helm: Path) -> None:
    spec = pod_spec(objects(helm))
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in spec
    assert pod_spec(objects(helm, "runtimeClassName=nvidia"))["runtimeClassName"] == "nvidia"


def test_security_context_is_minimal(helm: Path) -> None:
    objs = objects(helm)
    spec = pod_spec(objs)
    assert not spec["hostNetwork"] and not spec["hostPID"] and not spec["hostIPC"]
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    ctx = container(objs)["securityContext"]
    assert ctx["privileged"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert ctx["runAsUser"] == 0 and ctx["runAsGroup"] == 2500  # the socket is root:2500
    # The API server refuses allowPrivilegeEscalation=false together with SYS_ADMIN.
    assert ctx["allowPrivilegeEscalation"] is True
    assert spec["automountServiceAccountToken"] is False
    assert objs["ServiceAccount"]["automountServiceAccountToken"] is False
    assert "nvidia.com/gpu" not in str(container(objs).get("resources", {}))


@pytest.mark.parametrize("backend", ["readonly", "sim"])
def test_backends_that_never_write_get_no_capability(helm: Path, backend: str) -> None:
    ctx = container(objects(helm, f"backend={backend}"))["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["allowPrivilegeEscalation"] is False
    assert f"--backend={backend}" in container(objects(helm, f"backend={backend}"))["args"]


def test_sockets_on_host_paths(helm: Path) -> None:
    objs = objects(helm)
    volumes, mounts = volumes_and_mounts(objs)
    assert volumes["socket-dir"]["hostPath"] == {"path": "/run/envpipe", "type": "DirectoryOrCreate"}
    assert mounts["socket-dir"]["mountPath"] == "/run/envpipe" and not mounts["socket-dir"].get("readOnly")
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    args = container(objs)["args"]
    assert f"--socket={DEFAULT_SOCKET}" in args  # the daemon's own default, where the client looks
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in args
    assert "--ownership=kubelet" in args


def test_socket_group_and_mode_follow_values(helm: Path) -> None:
    c = container(objects(helm, "socket.gid=3100", "socket.mode=0660"))
    assert c["securityContext"]["runAsGroup"] == 3100
    assert {"--socket-mode=0660", "--socket-group=3100"} <= set(c["args"])


def test_metrics_only_from_allowed_peers(helm: Path) -> None:
    policy = objects(helm, "metrics.port=9500")["NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "envpipe-clockd", "app.kubernetes.io/instance": "clockd"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9500, "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"envpipe.io/scrape-clockd": "true"}}}]
    assert "NetworkPolicy" not in objects(helm, "metrics.networkPolicy.enabled=false")


def test_local_ownership_mounts_no_kubelet_socket(helm: Path) -> None:
    objs = objects(helm, "ownership=local")
    assert "pod-resources" not in {v["name"] for v in pod_spec(objs)["volumes"]}
    assert not any(a.startswith("--pod-resources-socket") for a in container(objs)["args"])


def test_probes_and_metrics(helm: Path) -> None:
    objs = objects(helm, "metrics.port=9500")
    c = container(objs)
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}
    assert "--metrics-port=9500" in c["args"]
    annotations = objs["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9500"
    assert "ServiceMonitor" not in objs
    monitored = objects(helm, "metrics.serviceMonitor.enabled=true", "metrics.annotations=false")
    assert monitored["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitored["Service"]["spec"]["clusterIP"] == "None"
    assert not monitored["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]


def test_clock_flags_follow_values(helm: Path) -> None:
    args = container(objects(helm, "clocks.minMHz=900", "clocks.maxMHz=1980", "leaseTTLSeconds=2.5",
                             "backend=sim", "extraArgs={--sim-gpus=2}"))["args"]
    assert {"--min-mhz=900", "--max-mhz=1980", "--lease-ttl=2.5"} <= set(args)
    assert args[-1] == "--sim-gpus=2"


def test_update_strategy_and_resources(helm: Path) -> None:
    objs = objects(helm, "updateStrategy.type=OnDelete", "updateStrategy.rollingUpdate=null")
    assert objs["DaemonSet"]["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert container(objs)["resources"]["limits"]["memory"] == "256Mi"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("metrics.port=abc", "/metrics/port"),
        ("metrics.port=70000", "/metrics/port"),
        ("backend=gpu", "/backend"),
        ("ownership=nobody", "/ownership"),
        ("clocks.minMHz=-5", "/clocks/minMHz"),
        ("leaseTTLSeconds=0.1", "leaseTTLSeconds (0.1) must lie in 0.5-300"),
        ("leaseTTLSeconds=301", "/leaseTTLSeconds"),
        ("leaseTTLSeconds=fast", "/leaseTTLSeconds"),
        ("socket.hostDir=relative/dir", "/socket/hostDir"),
        ("socket.mode=777x", "/socket/mode"),
        ("socket.gid=0", "/socket/gid"),
        ("socket.gid=root", "/socket/gid"),
        ("metrics.networkPolicy.from=open", "/metrics/networkPolicy/from"),
        ("metrics.annotations=maybe", "/metrics/annotations"),
        ("tolerations=notalist", "/tolerations"),
        ("updateStrategy.type=Recreate", "/updateStrategy/type"),
        ("extraArgs={--max-rps,100}", "/extraArgs/1"),
        ("metrics.grafanaDashboard.enabled=maybe", "/metrics/grafanaDashboard/enabled"),
        ("metrics.grafanaDashboard.namespace=Not_A_Namespace", "/metrics/grafanaDashboard/namespace"),
        ("unknownKey=1", "unknownKey"),
    ],
)
def test_bad_values_are_refused(helm: Path, setting: str, message: str) -> None:
    result = render(helm, setting)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("mode", ["600", "0640", "604", "777", "664", "0"])
def test_only_the_listed_socket_modes_render(helm: Path, mode: str) -> None:
    """values.yaml lists two modes, 660 (the group) and 666 (every local user): any other is refused, a world-
    writable 777 and a mode without group access alike."""
    result = subprocess.run([str(helm), "template", "c", str(CHART), "--set-string", f"socket.mode={mode}"],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "/socket/mode" in result.stderr and "660" in result.stderr


def test_string_values_say_so_where_a_set_would_make_them_numbers(helm: Path) -> None:
    """The hint in values.yaml works as written: `--set-string socket.mode=666` renders, `--set` is refused by the
    schema (a number) and the comment above the key says which flag to use."""
    c = container(objects(helm, "socket.mode=666", flag="--set-string"))
    assert "--socket-mode=666" in c["args"]
    refused = render(helm, "socket.mode=666")
    assert refused.returncode != 0 and "/socket/mode" in refused.stderr
    values = (CHART / "values.yaml").read_text()
    for key in ("socket.mode", "image.tag"):
        assert f"--set-string {key}=" in values, key


def test_min_above_max_is_refused(helm: Path) -> None:
    result = render(helm, "clocks.minMHz=2000", "clocks.maxMHz=1000")
    assert result.returncode != 0
    assert "clocks.minMHz (2000) must not exceed clocks.maxMHz (1000)" in result.stderr


def test_notes_tell_what_to_do_next(helm: Path) -> None:
    # helm template does not print NOTES; install --dry-run=client renders them without a cluster.
    notes = subprocess.run([str(helm), "install", "clockd", str(CHART), "--namespace", "gpu-system",
                            "--dry-run=client"], capture_output=True, text=True)
    assert notes.returncode == 0, notes.stderr
    text = notes.stdout[notes.stdout.index("NOTES:"):]
    assert "kubectl -n gpu-system get pods -l app.kubernetes.io/instance=clockd" in text
    assert f"{DEFAULT_SOCKET} (root:2500, mode 660)" in text
    assert "curl -s localhost:9464/healthz" in text
    assert "kubectl label namespace gpu-system pod-security.kubernetes.io/enforce=privileged" in text
    assert "pod-security.kubernetes.io/warn=restricted" in text
    assert "envpipe.io/scrape-clockd=true" in text
    assert "--clockd-gid" not in text  # the defaults fit the launcher's


def test_notes_tell_the_launcher_flags_for_a_non_default_socket(helm: Path) -> None:
    notes = subprocess.run([str(helm), "install", "clockd", str(CHART), "--dry-run=client",
                            "--set", "socket.gid=3100"], capture_output=True, text=True)
    assert notes.returncode == 0, notes.stderr
    assert "envpipe-launch --backend kube --clockd-dir /run/envpipe --clockd-gid 3100" in notes.stdout


# The leased-clock state file on a host path, the reset guard container, and probes that tell a dead or
# unready daemon apart.

def test_the_state_file_lives_on_the_node(helm: Path) -> None:
    objs = objects(helm)
    volumes, mounts = volumes_and_mounts(objs)
    assert volumes["state-dir"]["hostPath"] == {"path": "/var/lib/envpipe-clockd", "type": "DirectoryOrCreate"}
    assert mounts["state-dir"]["mountPath"] == "/var/lib/envpipe-clockd" and not mounts["state-dir"].get("readOnly")
    assert "--state-file=/var/lib/envpipe-clockd/state.json" in container(objs)["args"]
    moved = container(objects(helm, "state.hostDir=/srv/clockd"))["args"]
    assert "--state-file=/srv/clockd/state.json" in moved


def test_the_state_file_stays_out_of_the_socket_directory(helm: Path) -> None:
    result = render(helm, "state.hostDir=/run/envpipe")
    assert result.returncode != 0 and "must not be socket.hostDir" in result.stderr
    assert "/state/hostDir" in render(helm, "state.hostDir=relative").stderr


def guard(objs: dict) -> dict:
    return next(c for c in pod_spec(objs)["containers"] if c["name"] == "reset-guard")


def test_the_reset_guard_shares_the_daemons_socket_state_and_privileges(helm: Path) -> None:
    objs = objects(helm)
    daemon, watcher = container(objs), guard(objs)
    assert watcher["image"] == daemon["image"] and watcher["args"][0] == "--guard"
    shared = ("--backend=", "--socket=", "--state-file=")
    assert [a for a in watcher["args"] if a.startswith(shared)] == [a for a in daemon["args"] if a.startswith(shared)]
    assert {m["name"] for m in watcher["volumeMounts"]} == {"socket-dir", "state-dir"}
    assert watcher["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert watcher["env"] == daemon["env"]  # NVML through the NVIDIA runtime, like the daemon
    readonly = guard(objects(helm, "backend=readonly"))["securityContext"]["capabilities"]
    assert readonly == {"drop": ["ALL"]}
    assert "reset-guard" not in {c["name"] for c in pod_spec(objects(helm, "resetGuard.enabled=false"))["containers"]}
    assert "/resetGuard/enabled" in render(helm, "resetGuard.enabled=maybe").stderr


def test_probes_tell_a_starting_a_stuck_and_an_unready_daemon_apart(helm: Path) -> None:
    c = container(objects(helm))
    startup, liveness, readiness = c["startupProbe"], c["livenessProbe"], c["readinessProbe"]
    assert startup["httpGet"]["path"] == liveness["httpGet"]["path"] == "/healthz"
    assert readiness["httpGet"]["path"] == "/readyz"  # 503 while a GPU is unhealthy
    # a start-up reset may wait one driver deadline (3 s) per GPU; a minute before liveness counts
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60
    assert liveness["periodSeconds"] * liveness["failureThreshold"] <= 15  # a stuck loop restarts soon
    assert "/startupProbe/failureThreshold" in render(helm, "startupProbe.failureThreshold=0").stderr


# Monitoring: the ServiceMonitor keeps the pod labels of leased GPUs, and the Grafana dashboard ships with
# the chart and asks only for series the daemon exports.

DASHBOARD = CHART / "dashboards" / "envpipe-clockd.json"


def test_the_service_monitor_keeps_the_labels_of_leased_gpus(helm: Path) -> None:
    (endpoint,) = objects(helm, "metrics.serviceMonitor.enabled=true")["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True  # not exported_pod
    assert {"action": "labeldrop", "regex": "pod|container|namespace"} in endpoint["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]


def test_the_grafana_dashboard_ships_with_the_chart(helm: Path) -> None:
    assert "ConfigMap" not in objects(helm)
    objs = objects(helm, "metrics.grafanaDashboard.enabled=true")
    config_map = objs["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "gpu-system"
    assert json.loads(config_map["data"]["envpipe-clockd.json"]) == json.loads(DASHBOARD.read_text())
    moved = objects(helm, "metrics.grafanaDashboard.enabled=true", "metrics.grafanaDashboard.namespace=monitoring")
    assert moved["ConfigMap"]["metadata"]["namespace"] == "monitoring"


def test_the_dashboard_asks_only_for_series_the_daemon_exports(tmp_path: Path) -> None:
    from benchmarks.clockd_study.harness import call
    from tests.support.clockd_helpers import daemon_thread, metric

    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    asked = {name for e in exprs for name in re.findall(r"envpipe_clockd_[a-z_]+", e)}
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock):
        gpu = call(sock, "GET", "/v1/gpus")[1]["gpus"][0]["uuid"]
        pod = {"namespace": "team", "name": "job-worker-0"}
        lease = call(sock, "POST", "/v1/leases", {"gpus": [gpu], "pod": pod})[1]["lease"]
        call(sock, "POST", f"/v1/gpus/{gpu}/lock", {"lease": lease, "mhz": 1200})
        text = call(sock, "GET", "/metrics")[1]
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE envpipe_clockd_")}
    assert asked and asked <= exported, asked - exported
    labels = {k for s, _ in metric(text, "envpipe_clockd_lease_energy_joules_total") for k in s}
    assert {"namespace", "pod"} <= labels  # what the per-job panel groups by
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "envpipe-clockd"
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    assert all(topic in titles for topic in ("energy per job", "clock per gpu", "leases"))

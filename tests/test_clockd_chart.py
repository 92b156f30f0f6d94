"""What issue #15 adds to charts/envpipe-clockd: the leased-clock state file on a host path, the reset
guard container, and probes that tell a dead or unready daemon apart (the real helm engine renders)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_chart_clockd import container, find_helm, objects, pod_spec, render


@pytest.fixture(scope="module")
def helm() -> Path:
    return find_helm()  # HelmNotFound says why there is none


def test_the_state_file_lives_on_the_node(helm: Path) -> None:
    objs = objects(helm)
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    mounts = {m["name"]: m for m in container(objs)["volumeMounts"]}
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

"""What issue #15 adds to charts/envpipe-clockd: the leased-clock state file on a host path, the reset
guard container, and probes that tell a dead or unready daemon apart (the real helm engine renders)."""

from __future__ import annotations

from pathlib import Path

from tests.test_chart_clockd import container, helm, objects, pod_spec, render  # noqa: F401 (helm: fixture)


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

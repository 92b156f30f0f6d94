"""Who is calling: peer credentials across PID namespaces, the pod from the peer's cgroup, rate limits
and audit lines per pod, and leases that end when their owner dies even if forked children live on."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from benchmarks.clockd_study.harness import call, daemon_process
from envpipe.clock.client import ClockClient
from envpipe.clock.identity import Peer, pod_of_cgroup, resolve
from tests.support.clockd_helpers import ROOT, daemon_thread, wait_for

POD_UID = "1f2e3d4c-5b6a-4789-8abc-def012345678"
CONTAINER = "a" * 64


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroup v2, systemd driver, containerd
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CONTAINER}.scope\n",
        # cgroup v1 (hybrid), cgroupfs driver: the unified line is empty, the named hierarchies say it
        f"12:memory:/kubepods/besteffort/pod{POD_UID}/{CONTAINER}\n1:name=systemd:/kubepods/besteffort/"
        f"pod{POD_UID}/{CONTAINER}\n0::/\n",
        # guaranteed QoS (no QoS slice), CRI-O
        f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/crio-{CONTAINER}.scope\n",
        # systemd driver, Docker (cri-dockerd)
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/"
        f"docker-{CONTAINER}.scope\n",
    ],
)
def test_pod_uid_and_container_from_cgroup(cgroup) -> None:
    assert pod_of_cgroup(cgroup) == (POD_UID, CONTAINER)


@pytest.mark.parametrize("cgroup", ["0::/user.slice/user-1000.slice/session-2.scope\n", "0::/\n", ""])
def test_no_pod_outside_kubernetes(cgroup) -> None:
    assert pod_of_cgroup(cgroup) is None


def test_resolve_reads_the_peers_cgroup_and_tolerates_a_hidden_or_vanished_peer(tmp_path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{POD_UID}/{CONTAINER}\n")
    seen = resolve(4242, 1000, 1000, proc_root=str(tmp_path))
    assert seen.pod_uid == POD_UID and seen.container == CONTAINER
    assert seen.key == f"pod-uid:{POD_UID}"
    assert "pod_uid=" + POD_UID in seen.describe()
    hidden = resolve(0, 1000, 1000, proc_root=str(tmp_path))  # SO_PEERCRED of another PID namespace
    assert hidden.pid is None and hidden.pod_uid is None and "pid=0" not in hidden.describe()
    assert hidden.key == "uid:1000"  # what it claims never picks its budget
    gone = resolve(999999, 1000, 1000, proc_root=str(tmp_path))  # exited before we looked
    assert gone.pod_uid is None and gone.key == "pid:999999"
    assert Peer(address="127.0.0.1").key == "tcp:127.0.0.1"


def pid_namespace_prefix() -> tuple[str, ...]:
    """Run a daemon in its own PID namespace, as the chart does (hostPID: false)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    # --kill-child: if the test dies, unshare's death takes the daemon (PID 1 in there) with it
    prefix = ("unshare", "--pid", "--kill-child", "--mount-proc")
    prefix += () if os.geteuid() == 0 else ("--map-root-user",)
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.strip()}")
    return prefix


def stop_in_namespace(daemon: subprocess.Popen[str]) -> str:
    """SIGTERM the daemon inside (unshare ignores SIGTERM); its output."""
    with open(f"/proc/{daemon.pid}/task/{daemon.pid}/children") as f:
        os.kill(int(f.read().split()[0]), signal.SIGTERM)
    return daemon.communicate(timeout=20)[0]


@contextlib.contextmanager
def daemon_in_pid_namespace(sock: str) -> Iterator[None]:
    daemon = daemon_process(sock, prefix=pid_namespace_prefix())
    try:
        yield
    finally:
        stop_in_namespace(daemon)


@pytest.mark.slow
def test_in_its_own_pid_namespace_a_lease_keeps_its_budget_and_claims_buy_none(tmp_path) -> None:
    """Pids hidden (the chart's daemon): every pod of one uid is one caller until it names a lease. A flood
    that rotates the pod it claims still spends one budget; the leased pod's requests count on its lease."""
    sock = str(tmp_path / "c.sock")
    daemon = daemon_process(sock, "--max-rps", "20", "--max-mhz", "1400", prefix=pid_namespace_prefix())
    try:
        gpus = [g["uuid"] for g in call(sock, "GET", "/v1/gpus")[1]["gpus"]]
        body = {"gpus": gpus[:1], "pod": {"namespace": "team", "name": "trainer-0"}}
        status, lease = call(sock, "POST", "/v1/leases", body, headers={"X-Envpipe-Pod": "team/trainer-0"})
        assert status == 201
        rotating = [{"X-Envpipe-Pod": f"team/flooder-{i}"} for i in range(60)]
        assert 429 in [call(sock, "GET", "/v1/gpus", headers=h)[0] for h in rotating]
        renew = f"/v1/leases/{lease['lease']}/renew"
        assert [call(sock, "POST", renew)[0] for _ in range(10)] == [200] * 10  # its own budget
        lock = {"lease": lease["lease"], "mhz": 1200}
        assert call(sock, "POST", f"/v1/gpus/{gpus[0]}/lock", lock)[0] == 200
        time.sleep(1.1)  # the uid's budget refills: the next pod may open its lease
        with ClockClient(sock, gpu_uuids=gpus[1:2], pod={"namespace": "team", "name": "trainer-1"}) as client:
            client.set(gpus[1], 1410)  # above --max-mhz: 422
            client.flush()
    finally:
        out = stop_in_namespace(daemon)
    opened = [json.loads(line.split(" INFO ", 1)[1]) for line in out.splitlines() if '"lease_open"' in line]
    assert len(opened) == 2 and "pod=team/trainer-0" in opened[0]["owner"]
    assert "pid=0" not in opened[0]["owner"] and "pid=hidden" in opened[0]["owner"]
    refused = [json.loads(line.split(" INFO ", 1)[1]) for line in out.splitlines() if '"refused"' in line]
    # one caller for the whole flood: uid 0 (root here, or the root that unshare --map-root-user maps us to)
    assert {r["caller"] for r in refused if r["code"] == "too_many_requests"} == {"uid:0"}
    assert any(r["code"] == "out_of_range" and r["caller"].startswith("lease:") for r in refused)


FORKING_CLIENT = """
import ctypes, os, sys, time
from envpipe.clock import ClockClient
c = ClockClient(sys.argv[1], gpu_uuids=[sys.argv[2]], ttl_s=5.0)
c.lock_now(sys.argv[2], 1000)
# a C-level fork skips Python's at-fork handlers (what a native library's fork does)
pid = ctypes.CDLL(None).fork() if sys.argv[3] == "native" else os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fork", "daemon_sees_pids"),
    # A native fork seen from another PID namespace cannot be told apart (docs/clockd.md): not here.
    [("python", True), ("native", True), ("python", False)],
    ids=["python-fork", "native-fork", "python-fork-pid-hidden"],
)
def test_a_lease_ends_when_its_owner_dies_even_if_forked_children_live(tmp_path, fork, daemon_sees_pids) -> None:
    """A DataLoader worker forked by the trainer holds a copy of the attach socket; killing the trainer
    must still reset its GPU at once, not at the 5 s TTL. The daemon watches the attaching process where
    it can see it; elsewhere the client's at-fork handler drops the child's copy."""
    sock = str(tmp_path / "c.sock")
    with daemon_thread(sock) if daemon_sees_pids else daemon_in_pid_namespace(sock):
        gpu = call(sock, "GET", "/v1/gpus")[1]["gpus"][0]["uuid"]
        owner = subprocess.Popen(
            [sys.executable, "-c", FORKING_CLIENT, sock, gpu, fork],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        try:
            assert call(sock, "GET", f"/v1/gpus/{gpu}")[1]["locked"] is not None
            owner.send_signal(signal.SIGKILL)
            owner.wait()
            waited = wait_for(lambda: call(sock, "GET", f"/v1/gpus/{gpu}")[1]["locked"] is None, 8.0)
            assert waited < 2.0  # the TTL is 5 s
        finally:
            owner.kill()
            os.kill(child, signal.SIGKILL)  # first: the forked child holds the owner's stdout until it ends
            owner.communicate()

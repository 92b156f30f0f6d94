"""The runtime image's entrypoint, run for real: worker mode starts sshd with fresh host keys and
accepts only the given public key; launcher mode runs the command with the ssh client prepared; node
mode (one pod of the launcher's Indexed Job) serves ssh on every index and runs the command on 0."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "images" / "runtime" / "entrypoint.sh"
SSHD_CONFIG = ROOT / "images" / "runtime" / "sshd_config"

needs_ssh = pytest.mark.skipif(
    not (Path("/usr/sbin/sshd").exists() and shutil.which("ssh") and shutil.which("ssh-keygen")),
    reason="openssh-server/openssh-client not installed (.ci/apt-deps installs them)",
)


def local_sshd_config(home: Path, port: int) -> Path:
    """The image's sshd_config with only what differs outside the image replaced: port, paths, user."""
    user = getpass.getuser()
    text = SSHD_CONFIG.read_text()
    text = text.replace("Port 2222", f"Port {port}\nListenAddress 127.0.0.1")
    text = text.replace("/home/envpipe", str(home)).replace("/tmp/envpipe-sshd.pid", str(home / "sshd.pid"))
    text = text.replace("AllowUsers envpipe", f"AllowUsers {user}")
    # sshd resolves a relative AuthorizedKeysFile against the passwd home, which is $HOME in the image.
    keys = "AuthorizedKeysFile .ssh/authorized_keys"
    text = text.replace(keys, f"AuthorizedKeysFile {home}/.ssh/authorized_keys")
    # The test home lies under the world-writable /tmp, which StrictModes rightly refuses.
    text += "StrictModes no\n"
    if user == "root":
        text = text.replace("PermitRootLogin no", "PermitRootLogin prohibit-password")
    path = home / "sshd_config"
    path.write_text(text)
    return path


def entrypoint_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVPIPE_")}
    env.update(HOME=str(home), ENVPIPE_SSH_DIR=str(home / "mounted"), **extra)
    return env


def test_worker_without_keys_fails_clearly(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "worker"], env=entrypoint_env(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "needs a public key" in result.stderr


def test_launcher_without_command_fails_clearly(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "launcher"], env=entrypoint_env(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "launcher needs a command" in result.stderr


def test_launcher_runs_command_with_port_2222_client_config(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "launcher", "cat", str(tmp_path / ".ssh" / "config")],
        env=entrypoint_env(tmp_path), capture_output=True, text=True, check=True,
    )
    assert "Port 2222" in result.stdout


@needs_ssh
@pytest.mark.slow
def test_worker_serves_ssh_with_key_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    port = free_port()
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory when root
    env = entrypoint_env(
        home,
        ENVPIPE_SSH_AUTHORIZED_KEYS=(tmp_path / "id_ed25519.pub").read_text(),
        ENVPIPE_SSHD_CONFIG=str(local_sshd_config(home, port)),
        POD_NAME="job-worker-1",
        ENVPIPE_GPU_UUID="GPU-1234",
        ENVPIPE_CLOCK="daemon",  # the job's setting, not the pod's: pdsh passes it, not this file
    )
    sshd = subprocess.Popen(["bash", str(ENTRYPOINT), "worker"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        ssh = ["ssh", "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5"]
        target = f"{getpass.getuser()}@127.0.0.1"
        deadline = time.monotonic() + 10
        while True:
            ok = subprocess.run([*ssh, "-i", str(key), target, "echo", "worker-ok"],
                                capture_output=True, text=True)
            if ok.returncode == 0 or time.monotonic() > deadline or sshd.poll() is not None:
                break
            time.sleep(0.2)
        assert ok.stdout.strip() == "worker-ok", ok.stderr + _stop(sshd)
        assert (home / ".ssh" / "hostkeys" / "ssh_host_ed25519_key").exists()
        # sshd hands these to every session (PermitUserEnvironment lists them); the e2e test sees them used
        session_env = home / ".ssh" / "environment"
        assert session_env.read_text() == "POD_NAME=job-worker-1\nENVPIPE_GPU_UUID=GPU-1234\n"
        assert session_env.stat().st_mode & 0o777 == 0o600
        refused = subprocess.run([*ssh, "-i", str(other), target, "true"], capture_output=True, text=True)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def _stop(proc: subprocess.Popen[str]) -> str:
    """Stop sshd and return its log, for the failure message."""
    proc.terminate()
    return proc.communicate(timeout=10)[1]


def test_node_without_command_fails_clearly(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(ENTRYPOINT), "node"], env=entrypoint_env(tmp_path), capture_output=True,
                            text=True)
    assert result.returncode == 2 and "node needs the command that node 0 runs" in result.stderr


def _port_answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@needs_ssh
def test_node_mode_serves_ssh_everywhere_and_runs_the_command_on_node_zero(tmp_path: Path) -> None:
    """The launcher's Indexed Job: on index 0 the command runs while this node's sshd serves (pdsh logs
    into node 0 too) and its exit status is the container's; on any other index only sshd runs."""
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory when root
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    for index in ("0", "1"):
        home = tmp_path / f"home{index}"
        home.mkdir(mode=0o700)
        port = free_port()
        env = entrypoint_env(home, ENVPIPE_SSH_AUTHORIZED_KEYS=(tmp_path / "id_ed25519.pub").read_text(),
                             ENVPIPE_SSHD_CONFIG=str(local_sshd_config(home, port)), JOB_COMPLETION_INDEX=index)
        probe = (f"for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && exit 7; sleep 0.1; "
                 f"done; exit 1")
        node = subprocess.Popen(["bash", str(ENTRYPOINT), "node", "bash", "-c", probe], env=env,
                                stderr=subprocess.PIPE, text=True)
        try:
            if index == "0":  # the command saw its own node's sshd answer, and its status is the node's
                assert node.wait(timeout=20) == 7, node.stderr.read() if node.stderr else ""
            else:  # sshd in the foreground, the command never runs
                deadline = time.monotonic() + 10
                while not _port_answers(port) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert _port_answers(port) and node.poll() is None
        finally:
            node.terminate()
            node.wait(timeout=10)
            pid_file = home / "sshd.pid"  # node 0's sshd, left in the background (tini ends it in a pod)
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)


@needs_ssh
def test_a_node_told_where_node_zero_is_ends_once_node_zero_has(tmp_path: Path) -> None:
    """Where the cluster has no Job successPolicy (Kubernetes before 1.31), node 0's end must end the other
    nodes' pods: a node > 0 with ENVPIPE_LAUNCHER_NODE serves ssh while node 0's sshd answers, and exits 0
    (its sshd stopped) once node 0, answering before, has stopped answering three times in a row."""
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    home = tmp_path / "home1"
    home.mkdir(mode=0o700)
    port = free_port()
    zero = socket.socket()  # node 0's sshd, as far as node 1 can tell
    zero.bind(("127.0.0.1", 0))
    zero.listen()
    env = entrypoint_env(home, ENVPIPE_SSH_AUTHORIZED_KEYS=(tmp_path / "id_ed25519.pub").read_text(),
                         ENVPIPE_SSHD_CONFIG=str(local_sshd_config(home, port)), JOB_COMPLETION_INDEX="1",
                         ENVPIPE_LAUNCHER_NODE=f"127.0.0.1:{zero.getsockname()[1]}", ENVPIPE_LAUNCHER_POLL_S="0.2")
    node = subprocess.Popen(["bash", str(ENTRYPOINT), "node", "true"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not _port_answers(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # five polls while node 0 answers: still serving
        assert _port_answers(port) and node.poll() is None
        zero.close()  # node 0 ends
        assert node.wait(timeout=20) == 0
        assert "node 0 (127.0.0.1:" in (node.stderr.read() if node.stderr else "")
        assert not _port_answers(port)  # its sshd stopped with it
    finally:
        zero.close()
        if node.poll() is None:
            node.terminate()
            node.wait(timeout=10)

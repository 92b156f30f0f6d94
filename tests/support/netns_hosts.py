"""Two "hosts" as Linux network namespaces joined by a veth link, each with sshd on port 2222.

Used by the ssh-backend tests (`launch_ssh` runs envpipe-launch on host 0): real sshd, real pdsh, real TCP
between namespaces. Needs root and `ip netns`; `netns_unavailable()` says why not when it cannot work here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
IFNAME = "ep0"
ROOT = Path(__file__).resolve().parents[2]


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "pdsh", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (run .ci/apt-deps)"
    if not os.path.exists(SSHD):
        return "sshd not installed (run .ci/apt-deps)"
    probe = f"eplprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _sh("ip", "netns", "del", probe)
    return None


@dataclass
class Hosts:
    workdir: Path
    names: list[str] = field(default_factory=list)
    ips: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def key(self) -> str:
        return str(self.workdir / "id_ed25519")

    def exec_argv(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[i], *argv]

    def pids(self, i: int) -> list[str]:
        """The processes running in host i's namespace."""
        return subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True, text=True).stdout.split()

    def close(self) -> None:
        # whatever still runs inside our namespaces (job processes of a failed test) goes too
        for i in range(len(self.names)):
            for pid in self.pids(i):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
        for p in self.procs:
            p.wait(timeout=10)
        for n in self.names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def start(workdir: Path, count: int = 2, subnet: str = "10.231.7", sshd: bool = True) -> Hosts:
    """`sshd=False`: namespaces and link only, for a test whose code under test starts sshd itself."""
    hosts = Hosts(workdir)
    tag = f"epl{os.getpid() % 100000}"
    try:
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hosts.key)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(workdir / "host_key"))
        shutil.copy(hosts.key + ".pub", workdir / "authorized_keys")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for i in range(count):
            name = f"{tag}n{i}"
            _sh("ip", "netns", "add", name)
            hosts.names.append(name)
            hosts.ips.append(f"{subnet}.{i + 1}")
            _sh("ip", "-n", name, "link", "set", "lo", "up")
        # a veth per pair of neighbours is enough for 2 hosts; more would need a bridge
        _sh(
            "ip",
            "link",
            "add",
            f"{tag}a",
            "netns",
            hosts.names[0],
            "type",
            "veth",
            "peer",
            "name",
            f"{tag}b",
            "netns",
            hosts.names[1],
        )
        for i, dev in enumerate((f"{tag}a", f"{tag}b")):
            # the same interface name on every host, so one GLOO_SOCKET_IFNAME fits all of them
            _sh("ip", "-n", hosts.names[i], "link", "set", dev, "name", IFNAME)
            _sh("ip", "-n", hosts.names[i], "addr", "add", f"{hosts.ips[i]}/24", "dev", IFNAME)
            _sh("ip", "-n", hosts.names[i], "link", "set", IFNAME, "up")
        for i in range(count if sshd else 0):
            cfg = workdir / f"sshd_{i}.conf"
            cfg.write_text(
                f"Port 2222\nListenAddress {hosts.ips[i]}\nHostKey {workdir}/host_key\n"
                f"PidFile {workdir}/sshd_{i}.pid\nAuthorizedKeysFile {workdir}/authorized_keys\n"
                "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nMaxStartups 100\n"
            )
            hosts.procs.append(
                subprocess.Popen(
                    hosts.exec_argv(i, [SSHD, "-D", "-e", "-f", str(cfg)]), stderr=subprocess.DEVNULL
                )
            )
        for i in range(count if sshd else 0):
            _wait_sshd(hosts, i)
    except BaseException:
        hosts.close()
        raise
    return hosts


def _wait_sshd(hosts: Hosts, i: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    probe = ["nc", "-z"] if shutil.which("nc") else None
    while time.monotonic() < deadline:
        if hosts.procs[i].poll() is not None:
            raise RuntimeError(f"sshd in {hosts.names[i]} exited with {hosts.procs[i].returncode}")
        argv = (
            [*probe, hosts.ips[i], "2222"]
            if probe
            else ["python3", "-c", f"import socket; socket.create_connection(('{hosts.ips[i]}', 2222), 1)"]
        )
        if subprocess.run(hosts.exec_argv(0, argv), capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"sshd in {hosts.names[i]} not listening after {timeout_s}s")


def launch_ssh(hosts: Hosts, *args: str, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`envpipe-launch --backend ssh ARGS` on host 0 with the hosts' key, in `cwd`; Ctrl-C and a failure at
    ``timeout``."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
    argv = [sys.executable, "-m", "envpipe_launch", "--backend", "ssh", "--ssh-key", hosts.key, *args]
    # the launcher runs on host 0, like a user on the first node of a cluster
    proc = subprocess.Popen(
        hosts.exec_argv(0, argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
        cwd=cwd,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the launcher forwards Ctrl-C to DeepSpeed, which stops the nodes
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"launcher timed out after {timeout}s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

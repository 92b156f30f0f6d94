"""ssh backend for real: 2 network-namespace hosts with sshd on 2222, pdsh, a 2x2 DeepSpeed CPU job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import netns_hosts

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "ds_pipe_cpu.py"
REASON = netns_hosts.netns_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"real ssh test impossible here: {REASON}")


@pytest.fixture
def hosts(tmp_path: Path):
    h = netns_hosts.start(tmp_path)
    yield h
    h.close()


def _launch(hosts: netns_hosts.Hosts, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
    argv = [sys.executable, "-m", "envpipe_launch", "--backend", "ssh", "--ssh-key", hosts.key, *args]
    # the launcher runs on host 0, like a user on the first node of a cluster
    proc = subprocess.Popen(
        hosts.exec_argv(0, argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the launcher forwards Ctrl-C to DeepSpeed, which stops the nodes
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"launcher timed out after {timeout}s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
def test_two_nodes_two_procs_pdsh(hosts: netns_hosts.Hosts, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # gloo would otherwise pick the address of the (shared) hostname, 127.0.x.1, on every host
    r = _launch(
        hosts,
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--hosts",
        ",".join(hosts.ips),
        "--env",
        f"GLOO_SOCKET_IFNAME={netns_hosts.IFNAME}",
        str(SCRIPT),
        str(out),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = sorted(p.read_text().split() for p in out.glob("rank*.txt"))
    assert [ln[1] for ln in lines] == ["0", "1", "2", "3"]
    assert {ln[3] for ln in lines} == {"4"}
    assert len({ln[5] for ln in lines}) == 2, "ranks must run in both network namespaces"
    assert len({ln[7] for ln in lines}) == 1, "pipeline ranks report the same loss"


def test_unreachable_worker_is_a_clear_error(hosts: netns_hosts.Hosts) -> None:
    r = _launch(
        hosts,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--connect-timeout",
        "1",
        "--hosts",
        f"{hosts.ips[0]},10.231.7.99",
        str(SCRIPT),
        "x",
        timeout=60,
    )
    assert r.returncode == 2
    assert "10.231.7.99:2222 unreachable" in r.stderr


def test_duplicate_host_refused(hosts: netns_hosts.Hosts) -> None:
    r = _launch(
        hosts, "--nodes", "2", "--hosts", f"{hosts.ips[0]},{hosts.ips[0]}", str(SCRIPT), "x", timeout=60
    )
    assert r.returncode == 2 and "duplicate host" in r.stderr

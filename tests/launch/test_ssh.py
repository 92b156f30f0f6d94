"""ssh backend for real: 2 network-namespace hosts with sshd on 2222, pdsh, a 2x2 DeepSpeed CPU job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import netns_hosts
from tests.support.hostile import HostileJob

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "ds_pipe_cpu.py"
REASON = netns_hosts.netns_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"real ssh test impossible here: {REASON}")


@pytest.fixture
def hosts(tmp_path: Path):
    h = netns_hosts.start(tmp_path)
    yield h
    h.close()


@pytest.mark.slow
def test_two_nodes_two_procs_pdsh(hosts: netns_hosts.Hosts, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # gloo would otherwise pick the address of the (shared) hostname, 127.0.x.1, on every host
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{ip} slots=2\n" for ip in hosts.ips))
    r = netns_hosts.launch_ssh(
        hosts,
        "--nodes",
        "2",
        "--hostfile",
        str(hostfile),
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


@pytest.mark.slow
def test_hostile_words_reach_both_hosts_as_typed(hosts: netns_hosts.Hosts, tmp_path: Path) -> None:
    """Over real pdsh, ssh and sshd: a working directory, script path, arguments and --env values with $(),
    backticks, quotes, spaces, *, $HOME, newlines and pdsh's %h arrive unchanged on both hosts, and nothing
    of them runs as shell code (tests/support/hostile.py; test_words.py follows the same job through fakes)."""
    job = HostileJob.make(tmp_path)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{ip} slots=1\n" for ip in hosts.ips))
    r = netns_hosts.launch_ssh(hosts, "--nodes", "2", "--hostfile", str(hostfile), *job.env_options(), "--",
                               job.script, *job.args, cwd=job.cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    job.check(f"{job.cwd}:{ROOT}:{ROOT / 'launcher'}", local_ranks=(0, 0))


def test_unreachable_worker_is_a_clear_error(hosts: netns_hosts.Hosts) -> None:
    r = netns_hosts.launch_ssh(
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
    r = netns_hosts.launch_ssh(
        hosts, "--nodes", "2", "--hosts", f"{hosts.ips[0]},{hosts.ips[0]}", str(SCRIPT), "x", timeout=60
    )
    assert r.returncode == 2 and "duplicate host" in r.stderr


@pytest.mark.slow
def test_one_host_runs_on_that_host(hosts: netns_hosts.Hosts, tmp_path: Path) -> None:
    """DeepSpeed runs a single host's ranks where it is started unless told --force_multi: the old code ran
    this job on host 0, the launcher's, and a real job there waited for a rendezvous that never came."""
    script = tmp_path / "where.py"
    script.write_text(
        "import os, sys\n"
        "open(os.path.join(sys.argv[-1], 'netns'), 'w').write(str(os.stat('/proc/self/ns/net').st_ino))\n"
    )
    r = netns_hosts.launch_ssh(hosts, "--nodes", "1", "--gpus-per-node", "1", "--hosts", hosts.ips[1], str(script),
                               str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    host_1 = subprocess.run(
        hosts.exec_argv(1, ["stat", "-L", "-c", "%i", "/proc/self/ns/net"]), capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (tmp_path / "netns").read_text() == host_1


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)])
def test_a_signal_to_the_launcher_stops_every_rank_on_every_host(
    hosts: netns_hosts.Hosts, tmp_path: Path, signum: int, status: int
) -> None:
    """SIGINT is forwarded; after SIGKILL no handler of the launcher runs, and its supervisor stops the job."""
    script = tmp_path / "wait.py"
    script.write_text(
        "import os, sys, time\n"
        "open(os.path.join(sys.argv[-1], f'started.{os.getpid()}'), 'w').close()\n"
        "time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
    argv = [sys.executable, "-m", "envpipe_launch", "--backend", "ssh", "--ssh-key", hosts.key]
    argv += [
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--hosts",
        ",".join(hosts.ips),
        str(script),
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        hosts.exec_argv(0, argv), env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("started.*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(tmp_path.glob("started.*"))) == 4
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err[-2000:]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_job_pids(hosts, i, script) for i in range(2)):
        time.sleep(0.2)
    assert not any(_job_pids(hosts, i, script) for i in range(2)), err[-2000:]


def _job_pids(hosts: netns_hosts.Hosts, i: int, script: Path) -> list[str]:
    """Processes in host i's namespace that still run the job script."""
    alive = []
    for pid in hosts.pids(i):
        try:
            if str(script) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                alive.append(pid)
        except OSError:
            continue
    return alive

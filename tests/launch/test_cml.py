"""cml backend against the fake `cml.workers_v1` in tests/support/fakes/cml (same API as CML documents)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from envpipe_launch import net
from envpipe_launch.backends import cml
from envpipe_launch.errors import LaunchError
from envpipe_launch.job import JobSpec

from tests.support.clockd_helpers import wait_for
from tests.support.ports import free_port

FAKES = str(Path(__file__).resolve().parents[1] / "support" / "fakes")
NO_SSHD = next(
    (f"{t} not installed (run .ci/apt-deps)" for t in ("ssh-keygen", cml.SSHD) if shutil.which(t) is None), None
)


@pytest.fixture
def workers(monkeypatch, tmp_path):
    if NO_SSHD:
        pytest.skip(NO_SSHD)
    monkeypatch.syspath_prepend(FAKES)
    monkeypatch.setenv("HOME", str(tmp_path))  # keys go to $HOME/.envpipe/ssh (the project filesystem)
    monkeypatch.setenv("CDSW_IP_ADDRESS", "10.0.0.2")
    from cml import workers_v1

    workers_v1.reset()
    yield workers_v1
    sys.modules.pop("cml.workers_v1", None)
    sys.modules.pop("cml", None)


def _spec(nodes: int = 3) -> JobSpec:
    return JobSpec(nodes=nodes, gpus_per_node=4, script=__file__, backend="cml").validate()


class Recorder:
    def __init__(self, code: int = 0) -> None:
        self.code, self.hosts, self.master = code, None, None

    def __call__(self, spec, hosts, ssh_key=None, master_addr=None) -> int:
        self.hosts, self.master = [(h.host, h.slots) for h in hosts], master_addr
        return self.code


def _stopped(workers) -> list[tuple]:
    return [c[1] for c in workers.calls if c[0] == "stop_workers"]


def test_hostfile_from_session_and_worker_ips(workers, monkeypatch) -> None:
    monkeypatch.setenv("ENVPIPE_FAKE_CML_IPS", "10.0.0.7,10.0.0.8")
    monkeypatch.setenv("ENVPIPE_FAKE_CML_UNKNOWN_POLLS", "2")  # IPs are "unknown" on the first two polls
    run = Recorder(code=5)
    assert cml.with_workers(_spec(), cml.CmlOptions(ready_timeout_s=30), run) == 5
    assert run.hosts == [("10.0.0.2", 4), ("10.0.0.7", 4), ("10.0.0.8", 4)]
    assert run.master == "10.0.0.2"
    ((_name, args, kwargs),) = [c for c in workers.calls if c[0] == "launch_workers"]
    assert args[0] == 2 and kwargs["nvidia_gpu"] == 4 and kwargs["code"].startswith("!")
    assert "sshd -D -e -p 2222" in kwargs["code"]
    assert sum(c[0] == "await_workers" for c in workers.calls) == 3
    assert all(not c[2]["wait_for_completion"] for c in workers.calls if c[0] == "await_workers")
    assert len(_stopped(workers)) == 1 and len(_stopped(workers)[0]) == 2


def test_failed_worker_is_reported_and_all_stopped(workers, monkeypatch) -> None:
    monkeypatch.setenv("ENVPIPE_FAKE_CML_FAIL", "1")
    with pytest.raises(LaunchError, match=r"CML workers failed to start: \w+ \(failed\)"):
        cml.with_workers(_spec(), cml.CmlOptions(), Recorder())
    assert len(_stopped(workers)[0]) == 2
    assert all(w["status"] in ("stopped", "failed") for w in workers.workers.values())


def test_unreachable_worker_with_the_real_ssh_runner(workers, monkeypatch) -> None:
    monkeypatch.setenv("ENVPIPE_FAKE_CML_IPS", "192.0.2.1")  # TEST-NET-1: never answers
    monkeypatch.setenv("CDSW_IP_ADDRESS", "192.0.2.2")

    def real(spec, hosts, ssh_key=None, master_addr=None):
        return cml.ssh.run_on_hosts(spec, hosts, cml.ssh.Reach(ssh_key, master_addr, connect_timeout_s=0.3))

    with pytest.raises(LaunchError, match="unreachable"):
        cml.with_workers(_spec(nodes=2), cml.CmlOptions(), real)
    assert len(_stopped(workers)) == 1


def test_keys_prepared_before_workers_start(workers, tmp_path, monkeypatch) -> None:
    run = Recorder()
    seen: list[str] = []
    cml_launch_workers = workers.launch_workers

    def launch_workers(*a, **kw):
        seen.extend(sorted(p.name for p in (tmp_path / ".envpipe" / "ssh").iterdir()))
        return cml_launch_workers(*a, **kw)

    monkeypatch.setattr(workers, "launch_workers", launch_workers)
    assert cml.with_workers(_spec(nodes=2), cml.CmlOptions(), run) == 0
    # the shared host key exists before any worker's sshd could race to create it
    assert seen == ["authorized_keys", "host_key", "host_key.pub", "id_ed25519", "id_ed25519.pub"]
    d = tmp_path / ".envpipe" / "ssh"
    pub = (d / "id_ed25519.pub").read_text().strip()
    assert (d / "authorized_keys").read_text().splitlines() == [pub]
    assert cml.prepare_keys(None) == str(d / "id_ed25519")  # a second launch reuses the key and adds no line
    assert (d / "authorized_keys").read_text().splitlines() == [pub]


def test_given_ssh_key_is_authorized_or_refused(workers, tmp_path) -> None:
    key = tmp_path / "mykey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp_path / "mykey.pub").unlink()  # the public half is derived from the private key
    assert cml.prepare_keys(str(key)) == str(key)
    auth = (tmp_path / ".envpipe" / "ssh" / "authorized_keys").read_text()
    assert auth.startswith("ssh-ed25519 ") and not (tmp_path / ".envpipe" / "ssh" / "id_ed25519").exists()
    with pytest.raises(LaunchError, match="--ssh-key /nonexistent: no such file"):
        cml.with_workers(_spec(), cml.CmlOptions(ssh_key="/nonexistent"), Recorder())
    assert workers.calls == []  # refused before any worker was launched


def test_single_node_launches_no_workers(workers) -> None:
    run = Recorder()
    assert cml.with_workers(_spec(nodes=1), cml.CmlOptions(), run) == 0
    assert run.hosts == [("10.0.0.2", 4)] and workers.calls == []


def test_outside_cml_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("CDSW_IP_ADDRESS", raising=False)
    with pytest.raises(LaunchError, match="CDSW_IP_ADDRESS is not set"):
        cml.with_workers(_spec(), cml.CmlOptions(), Recorder())
    monkeypatch.setenv("CDSW_IP_ADDRESS", "10.0.0.2")
    with pytest.raises(LaunchError, match=r"no cml\.workers_v1 module"):
        cml.with_workers(_spec(), cml.CmlOptions(), Recorder())


def _port_open(port: int) -> bool:
    return net.port_open("127.0.0.1", port)


def _sshd_pids(port: int) -> list[int]:
    """The listening sshd daemons on `port`. A connection (e.g. _port_open's probe) forks a child that keeps the
    daemon's command line for a moment, longer on a loaded machine: children of a found pid are not counted."""
    found = {}
    for p in psutil.process_iter(["name", "cmdline", "ppid", "status"]):
        listening = p.info["status"] != psutil.STATUS_ZOMBIE  # gone meanwhile: not a listening daemon
        if listening and p.info["name"] == "sshd" and f"-p {port} " in " ".join(p.info["cmdline"] or []):
            found[p.pid] = p.info["ppid"]
    return [pid for pid, ppid in found.items() if ppid not in found]


@pytest.fixture
def session_port(workers) -> int:
    """Keys prepared, sshd's privilege-separation directory made: a free port for cml.session_sshd."""
    if os.geteuid() != 0:
        pytest.skip("sshd's privsep needs root here")
    cml.prepare_keys(None)
    os.makedirs("/run/sshd", exist_ok=True)
    return free_port()


def test_session_sshd_stops_the_child_of_a_connection_still_open(session_port: int) -> None:
    # sshd's per-connection child runs in a session of its own (setsid): a signal to sshd's group misses it
    port = session_port
    with socket.socket() as client:
        with cml.session_sshd("127.0.0.1", port):
            client.connect(("127.0.0.1", port))
            (daemon,) = _sshd_pids(port)
            children: list[psutil.Process] = []
            groups: list[int] = []

            def forked() -> bool:  # sshd forked a child for the connection that is still there (a transient
                for child in psutil.Process(daemon).children():  # fork may end between the listing and its group)
                    children.append(child)
                    try:
                        groups.append(os.getpgid(child.pid))
                    except ProcessLookupError:
                        continue
                return bool(groups)

            wait_for(forked)
            assert daemon not in groups  # the premise: another process group
        assert [c for c in children if c.is_running()] == []


def test_session_sshd_runs_only_during_the_job(session_port: int) -> None:
    port = session_port
    with cml.session_sshd("127.0.0.1", port):
        assert _port_open(port) and len(_sshd_pids(port)) == 1
        with cml.session_sshd("127.0.0.1", port):  # already listening: nothing more is started
            assert len(_sshd_pids(port)) == 1
        assert _port_open(port)
    # the process itself, not the port: on a busy machine another program may take the freed port
    assert _sshd_pids(port) == []
    with pytest.raises(RuntimeError, match="job failed"), cml.session_sshd("127.0.0.1", port):
        raise RuntimeError("job failed")
    assert _sshd_pids(port) == []

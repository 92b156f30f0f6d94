"""cml: the session is node 0; `cml.workers_v1` launches N-1 workers running sshd on 2222, their
IPs (plus the session's CDSW_IP_ADDRESS) form the hostfile, then DeepSpeed runs as on ssh hosts.

DeepSpeed's pdsh runner reaches every host of the hostfile over ssh, the session included, so the
session runs the same sshd for the length of the job (unless something already listens on its port).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .. import deepspeed_cmd, hostfile, net, sshkeys
from ..command_line import CommandLine
from ..errors import LaunchError
from ..job import JobSpec
from ..supervise import Supervised
from . import ssh

# Workers share the project filesystem (/home/cdsw) with the session, so keys live there; sshd runs as
# the engine's (non-root) user with its host key, pid file and config in that directory.
SSH_DIR = "$HOME/.envpipe/ssh"
SSHD = "/usr/sbin/sshd"


def sshd_code(port: int) -> str:
    """`code` starting with "!" runs as a shell command on a CML worker."""
    return (
        # the host key is prepare_keys' (shared through the project filesystem), made before any worker
        f"!exec /usr/sbin/sshd -D -e -p {port} -f /dev/null "
        f"-h {SSH_DIR}/host_key -o PidFile={SSH_DIR}/sshd.pid -o StrictModes=no "
        f"-o AuthorizedKeysFile={SSH_DIR}/authorized_keys -o PasswordAuthentication=no"
    )


def _ssh_dir() -> str:
    return os.path.expandvars(SSH_DIR)


def client_key_path(ssh_key: str | None) -> str:
    """The ssh client key of the job: `ssh_key`, or the one generated once under SSH_DIR."""
    return ssh_key or os.path.join(_ssh_dir(), "id_ed25519")


def prepare_keys(ssh_key: str | None) -> str:
    """Before any worker starts: the shared host key, the client key (`ssh_key`, or one generated once
    under SSH_DIR) and its public half in authorized_keys. Returns the client key's path."""
    if not os.path.exists(SSHD):
        raise LaunchError(f"no {SSHD} here: the session and workers need openssh-server (images/runtime)")
    d = _ssh_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    if not os.path.exists(os.path.join(d, "host_key")):
        sshkeys.write(os.path.join(d, "host_key"))
    key = client_key_path(ssh_key)
    if not os.path.exists(key):
        if ssh_key:
            raise LaunchError(f"--ssh-key {ssh_key}: no such file")
        sshkeys.write(key)
    if os.path.exists(key + ".pub"):
        with open(key + ".pub") as f:
            pub = f.read().strip()
    else:
        pub = sshkeys.public_of(key).strip()
    auth = os.path.join(d, "authorized_keys")
    known = Path(auth).read_text().splitlines() if os.path.exists(auth) else []
    if pub not in known:
        with open(auth, "a") as f:
            f.write(pub + "\n")
        os.chmod(auth, 0o600)
    return key


@contextlib.contextmanager
def session_sshd(ip: str, port: int, timeout_s: float = 15.0) -> Iterator[None]:
    """sshd in this session (node 0) while the job runs; nothing is started if the port answers."""
    if net.port_open(ip, port, timeout_s=0.1):
        yield
        return
    os.makedirs(_ssh_dir(), mode=0o700, exist_ok=True)
    log_path = os.path.join(_ssh_dir(), "sshd-session.log")  # its connection log stays out of the job's
    with open(log_path, "ab") as log:
        # supervised: sshd gives each connection a child in a session of its own (setsid), and one still
        # connected would outlive a plain kill of sshd; nothing of it outlives the launcher either
        sshd = Supervised(["bash", "-c", sshd_code(port)[1:]], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        try:
            net.wait_for_port(ip, port, timeout_s)
        except LaunchError as e:
            raise LaunchError(
                f"sshd of this session (node 0) did not start on {ip}:{port} (see {log_path}): {e}"
            ) from e
        yield
    finally:
        sshd.stop()


def run_from_session(
    spec: JobSpec, hosts: list[hostfile.Host], ssh_key: str | None = None, master_addr: str | None = None
) -> int:
    with session_sshd(hosts[0].host, spec.ssh_port):
        return ssh.run_on_hosts(spec, hosts, ssh.Reach(ssh_key, master_addr))


@dataclass(frozen=True)
class CmlOptions:
    cpu: int = 4
    memory_gib: int = 16
    ready_timeout_s: float = 600.0
    ssh_key: str | None = None


def options(args: CommandLine) -> CmlOptions:
    return CmlOptions(cpu=args.worker_cpu, memory_gib=args.worker_memory, ready_timeout_s=args.ready_timeout,
                      ssh_key=args.ssh_key)


def _workers_api() -> ModuleType:
    for name in ("cml.workers_v1", "cdsw"):  # CML runtimes, then legacy CDSW engines
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise LaunchError("the cml backend runs inside a CML session (no cml.workers_v1 module here)")


def await_ips(api: ModuleType, ids: list[str], timeout_s: float) -> list[str]:
    """Workers may be running with ip_address "unknown" at first: ask again until all IPs show."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(1, int(deadline - time.monotonic()))
        res = api.await_workers(ids, wait_for_completion=False, timeout_seconds=left)
        if res.get("failures"):
            bad = ", ".join(f"{f.get('id')} ({f.get('status')})" for f in res["failures"])
            raise LaunchError(f"CML workers failed to start: {bad}")
        ips = {w["id"]: w.get("ip_address", "unknown") for w in res["workers"]}
        if all(ips.get(i, "unknown") != "unknown" for i in ids):
            return [ips[i] for i in ids]
        if time.monotonic() >= deadline:
            raise LaunchError(f"timed out after {timeout_s:g}s waiting for CML worker IP addresses")
        time.sleep(1)


def launch(spec: JobSpec, opts: CmlOptions) -> int:
    return with_workers(spec, opts, run_from_session)


def with_workers(spec: JobSpec, opts: CmlOptions, runner: Callable[..., int]) -> int:
    """Start the job's N-1 CML workers, hand the hosts (this session first) to `runner` (run_from_session:
    DeepSpeed from this session) and stop the workers; `runner`'s exit status."""
    session_ip = os.environ.get("CDSW_IP_ADDRESS")
    if not session_ip:
        raise LaunchError("CDSW_IP_ADDRESS is not set: the cml backend runs inside a CML session")
    api = _workers_api()
    deepspeed_cmd.check_multi_node(spec, client_key_path(opts.ssh_key))  # before any worker costs anything
    key = prepare_keys(opts.ssh_key)
    slots = max(spec.gpus_per_node, 1)
    ids: list[str] = []
    try:
        if spec.nodes > 1:
            launched = api.launch_workers(
                spec.nodes - 1,
                cpu=opts.cpu,
                memory=opts.memory_gib,
                nvidia_gpu=spec.gpus_per_node,
                code=sshd_code(spec.ssh_port),
            )
            ids = [w["id"] for w in launched]
            ips = await_ips(api, ids, opts.ready_timeout_s)
        else:
            ips = []
        hosts = [hostfile.Host(ip, slots) for ip in [session_ip, *ips]]
        return runner(spec, hostfile.check(hosts), ssh_key=key, master_addr=session_ip)
    finally:
        if ids:
            api.stop_workers(*ids)

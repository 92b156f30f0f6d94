"""cml: the session is node 0; `cml.workers_v1` launches N-1 workers running sshd on 2222, their
IPs (plus the session's CDSW_IP_ADDRESS) form the hostfile, then DeepSpeed runs as on ssh hosts."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from .. import hostfile
from ..errors import LaunchError
from ..job import JobSpec
from . import ssh

# Workers share the project filesystem (/home/cdsw) with the session, so keys live there; sshd runs as
# the engine's (non-root) user with its host key, pid file and config in that directory.
SSH_DIR = "$HOME/.envpipe/ssh"


def sshd_code(port: int) -> str:
    """`code` starting with "!" runs as a shell command on a CML worker."""
    return (
        f"!mkdir -p {SSH_DIR} && (test -f {SSH_DIR}/host_key || ssh-keygen -q -t ed25519 -N '' "
        f"-f {SSH_DIR}/host_key) && exec /usr/sbin/sshd -D -e -p {port} -f /dev/null "
        f"-h {SSH_DIR}/host_key -o PidFile={SSH_DIR}/sshd.pid -o StrictModes=no "
        f"-o AuthorizedKeysFile={SSH_DIR}/authorized_keys -o PasswordAuthentication=no"
    )


@dataclass
class CmlOptions:
    cpu: int = 4
    memory_gib: int = 16
    ready_timeout_s: float = 600.0
    ssh_key: str | None = None


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


def launch(spec: JobSpec, opts: CmlOptions, runner: Callable[..., int] = ssh.run_on_hosts) -> int:
    session_ip = os.environ.get("CDSW_IP_ADDRESS")
    if not session_ip:
        raise LaunchError("CDSW_IP_ADDRESS is not set: the cml backend runs inside a CML session")
    api = _workers_api()
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
        return runner(spec, hostfile.check(hosts), ssh_key=opts.ssh_key, master_addr=session_ip)
    finally:
        if ids:
            api.stop_workers(*ids)

"""What the user asked for, checked once, shared by every backend."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from . import kube_syntax
from .errors import LaunchError

BACKENDS = ("local", "ssh", "kube", "cml")
DS_LAUNCHERS = ("pdsh", "openmpi", "mvapich")
# Documented limits (docs/launcher.md): beyond them a typo would start thousands of pods or processes.
MAX_NODES = 4096
MAX_PROCS_PER_NODE = 256
# DeepSpeed's and torch's default rendezvous port: used where the master has a network of its own (a pod).
DEFAULT_MASTER_PORT = 29500
JOB_NAME_MAX = 50  # "<name>-worker-<i>" must stay a 63-character DNS label up to MAX_NODES workers


@dataclass(frozen=True)
class JobSpec:
    """The job whatever the backend: how many nodes and processes, the script and its arguments, the
    environment and rendezvous of every node."""

    nodes: int
    gpus_per_node: int
    script: str
    script_args: tuple[str, ...] = ()
    backend: str = "local"
    ds_launcher: str = "pdsh"
    ssh_port: int = 2222
    master_port: int | None = None  # None: a free port where the master runs (net.master_port)
    env: tuple[str, ...] = ()  # KEY=VAL exported on every node (checked by the CLI)
    # Set when the script lives only on the workers (kube/cml images), so it is not checked here.
    script_on_workers: bool = False
    stop_timeout_s: float = 10.0  # after SIGINT/SIGTERM, before SIGKILL

    def validate(self) -> JobSpec:
        """What the file system decides; each option by itself is checked where the CLI parses it."""
        if not self.script_on_workers:
            _check_script(self.script)
        return self


def _check_script(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise LaunchError(f"training script not found: {path} ({getattr(e, 'strerror', None) or e})") from e
    if not stat.S_ISREG(mode):
        raise LaunchError(f"training script {path}: not a regular file")


def env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """KEY=VAL strings (already checked by the CLI) as a mapping, in order."""
    return dict(pair.split("=", 1) for pair in pairs)


def job_name(prefix: str, suffix: str) -> str:
    """<prefix>-<suffix>, or `prefix` alone without a suffix (a name the user chose), refused unless it
    is a DNS label: never silently renamed. It names the job's Service, so it starts with a letter."""
    name = f"{prefix}-{suffix}" if suffix else prefix
    if not kube_syntax.is_dns1035_label(name, JOB_NAME_MAX):
        raise LaunchError(f"job name {name!r}: {JOB_NAME_RULE}")
    return name


JOB_NAME_RULE = (
    f"a job name is 1-{JOB_NAME_MAX} lowercase letters, digits and '-', starting with a letter and ending "
    "with a letter or digit (a DNS label, RFC 1035, as Kubernetes needs for the job's Service)"
)

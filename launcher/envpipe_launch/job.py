"""What the user asked for, checked once, shared by every backend."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .errors import LaunchError

BACKENDS = ("local", "ssh", "kube", "cml")
DS_LAUNCHERS = ("pdsh", "openmpi", "mvapich")


@dataclass
class JobSpec:
    nodes: int
    gpus_per_node: int
    script: str
    script_args: list[str] = field(default_factory=list)
    backend: str = "local"
    ds_launcher: str = "pdsh"
    ssh_port: int = 2222
    master_port: int = 29500
    env: list[str] = field(default_factory=list)  # KEY=VAL exported on every node
    # Set when the script lives only on the workers (kube/cml images), so it is not checked here.
    script_on_workers: bool = False

    def validate(self) -> JobSpec:
        if self.backend not in BACKENDS:
            raise LaunchError(f"unknown backend {self.backend!r} (choose from {', '.join(BACKENDS)})")
        if self.nodes < 1:
            raise LaunchError(f"--nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise LaunchError(f"--gpus-per-node must be >= 0, got {self.gpus_per_node}")
        if self.ds_launcher not in DS_LAUNCHERS:
            raise LaunchError(
                f"unknown DeepSpeed launcher {self.ds_launcher!r} (choose from {', '.join(DS_LAUNCHERS)})"
            )
        if not self.script_on_workers and not os.path.isfile(self.script):
            raise LaunchError(f"training script not found: {self.script}")
        return self


def job_name(prefix: str, suffix: str) -> str:
    """A DNS-1123 label usable for pods, services and secrets."""
    name = re.sub(r"[^a-z0-9-]", "-", f"{prefix}-{suffix}".lower()).strip("-")
    if not name or len(name) > 50:
        raise LaunchError(f"job name {name!r} must be 1-50 characters of [a-z0-9-]")
    return name

"""local: one node, N processes through DeepSpeed's own launcher (GPUs, or CPU + gloo without one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from .. import deepspeed_cmd, hostfile
from ..command_line import CommandLine
from ..errors import LaunchError
from ..job import JobSpec, env_pairs


def count_gpus() -> int:
    """Count GPUs without importing torch: `nvidia-smi -L` prints one line per GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def options(args: CommandLine) -> None:
    """The local backend has no options of its own."""


def launch(spec: JobSpec, opts: None) -> int:
    if spec.nodes != 1:
        raise LaunchError(f"the local backend runs one node; got --nodes {spec.nodes} (use ssh, kube or cml)")
    if spec.gpus_per_node < 1:
        raise LaunchError("the local backend needs --gpus-per-node >= 1 (the number of processes)")
    deepspeed_cmd.check_deepspeed()
    gpus = count_gpus()
    env = dict(os.environ)
    if gpus == 0:
        # No GPU: the same job on CPU processes; DeepSpeed's CPU accelerator uses gloo.
        env["DS_ACCELERATOR"] = "cpu"
        env.setdefault("ENVPIPE_DIST_BACKEND", "gloo")
    elif spec.gpus_per_node > gpus:
        raise LaunchError(f"--gpus-per-node {spec.gpus_per_node} but this machine has {gpus} GPU(s)")
    env.update(env_pairs(spec.env))  # one host: DeepSpeed's single-host path reads no env file
    with tempfile.TemporaryDirectory(prefix="envpipe-launch-") as tmp:
        path = os.path.join(tmp, "hostfile")
        with open(path, "w") as f:
            f.write(hostfile.render([hostfile.Host("localhost", spec.gpus_per_node)]))
        argv = deepspeed_cmd.deepspeed_argv(spec, path, "127.0.0.1")
        return deepspeed_cmd.run(argv, env, spec.stop_timeout_s)

"""The `deepspeed` command line for a hostfile, and running it with the exit code passed through."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys

from .errors import LaunchError
from .job import JobSpec

SSH_CLIENT_OPTS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"


def deepspeed_argv(
    spec: JobSpec, hostfile: str, master_addr: str, python: str = sys.executable, ssh_key: str | None = None
) -> list[str]:
    """`--master_addr` is always given: without it DeepSpeed runs `ssh <first host> hostname -I`."""
    argv = [
        python,
        "-u",
        "-m",
        "deepspeed.launcher.runner",
        "--hostfile",
        hostfile,
        "--master_addr",
        master_addr,
        "--master_port",
        str(spec.master_port),
        "--launcher",
        spec.ds_launcher,
        "--no_ssh_check",
    ]
    if spec.ds_launcher == "pdsh":
        argv += ["--ssh_port", str(spec.ssh_port)]
    elif spec.ds_launcher == "openmpi":  # its runner ignores --ssh_port: the port goes to mpirun's rsh agent
        rsh = f"-p {spec.ssh_port} {SSH_CLIENT_OPTS}" + (f" -i {ssh_key}" if ssh_key else "")
        argv += ["--launcher_args", f"--allow-run-as-root --mca plm_rsh_args {shlex.quote(rsh)}"]
    # mvapich: DeepSpeed writes its own MVAPICH hostfile; the ssh port must come from ~/.ssh/config
    return [*argv, spec.script, *spec.script_args]


def ssh_env(ssh_key: str | None) -> dict[str, str]:
    """pdsh reads extra ssh options from PDSH_SSH_ARGS_APPEND (DeepSpeed appends `-p PORT`)."""
    env = dict(os.environ)
    extra = SSH_CLIENT_OPTS + (f" -i {ssh_key}" if ssh_key else "")
    env["PDSH_SSH_ARGS_APPEND"] = f"{env.get('PDSH_SSH_ARGS_APPEND', '')} {extra}".strip()
    return env


def write_env_file(directory: str, pairs: list[str], env: dict[str, str]) -> None:
    """Variables for every node: DeepSpeed's runner reads KEY=VAL lines from $DS_ENV_FILE (an absolute
    path is honoured) and exports them on each host. A blank line would crash its parser, so none."""
    lines = []
    for pair in pairs:
        key, sep, _ = pair.partition("=")
        if not sep or not key.isidentifier():
            raise LaunchError(f"--env expects KEY=VALUE, got {pair!r}")
        lines.append(pair.strip())
    if lines:
        path = os.path.join(directory, "deepspeed_env")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        env["DS_ENV_FILE"] = path


def run(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run in its own process group; Ctrl-C and SIGTERM are forwarded, the child's code returned."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)

"""The `deepspeed` command line for a hostfile, what it needs on this machine, and running it with the
exit status passed through."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import signal
import sys

from . import net, supervise
from .errors import LaunchError
from .job import JobSpec, env_pairs

RUNNER_PACKAGE = "deepspeed"  # its launcher runs here, in this Python, for the local, ssh and cml backends
SSH_CLIENT_OPTS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
# What DeepSpeed's multi-node runner execs (and checks for, with a traceback when missing), per launcher.
LAUNCHER_TOOLS = {"pdsh": ("pdsh", "ssh"), "openmpi": ("ompi_info", "mpirun", "ssh"), "mvapich": ("mpiname", "mpirun")}
_INSTALL_HINT = {"pdsh": "apt-get install pdsh openssh-client", "openmpi": "apt-get install openmpi-bin openssh-client",
                 "mvapich": "install MVAPICH2-GDR"}
# DeepSpeed's launch.py reports a rank killed by signal N as exit status 256 - N (sys.exit(-N)); these
# are read back as the shell's 128 + N. 255 (SIGHUP) is left alone: it is also ssh's and pdsh's error.
_RANK_SIGNALS = (signal.SIGINT, signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGKILL,
                 signal.SIGSEGV, signal.SIGTERM)
# DeepSpeed's MultiNodeRunner.add_export strips a value and puts one with other characters than these in
# double quotes: pdsh's remote shell then expands $ ` \ " inside them; mpirun's -x/-env keep the quotes.
_PLAIN_VALUE = re.compile(r"[\w@%+=:,./-]*")
_SHELL_SPECIAL = re.compile(r'[$`"\\]')


def deepspeed_argv(
    spec: JobSpec,
    hostfile: str,
    master_addr: str,
    python: str = sys.executable,
    ssh_key: str | None = None,
    force_multi: bool = False,
) -> list[str]:
    """`--master_addr` is always given: without it DeepSpeed runs `ssh <first host> hostname -I`.
    `force_multi`: reach the hosts through the launcher even when there is only one (DeepSpeed
    otherwise runs a single host's ranks right here, whatever the host is)."""
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
        str(net.master_port(spec.master_port, master_addr)),
        "--launcher",
        spec.ds_launcher,
        "--no_ssh_check",
    ]
    if force_multi:
        argv.append("--force_multi")
    if spec.ds_launcher == "pdsh":
        argv += ["--ssh_port", str(spec.ssh_port)]
    elif spec.ds_launcher == "openmpi":  # its runner ignores --ssh_port: the port goes to mpirun's rsh agent
        rsh = f"-p {spec.ssh_port} {SSH_CLIENT_OPTS}" + (f" -i {ssh_key}" if ssh_key else "")
        argv += ["--launcher_args", f"--allow-run-as-root --mca plm_rsh_args {shlex.quote(rsh)}"]
    # mvapich: DeepSpeed writes its own MVAPICH hostfile; the ssh port must come from ~/.ssh/config
    return [*argv, spec.script, *spec.script_args]


def check_deepspeed() -> None:
    """DeepSpeed is importable here (found, not imported: the launcher never imports torch)."""
    if importlib.util.find_spec(RUNNER_PACKAGE) is None:
        raise LaunchError(
            f"this backend runs DeepSpeed's launcher with this Python ({sys.executable}), which has no "
            f"{RUNNER_PACKAGE} module (pip install 'envpipe[train]', or use the kube backend)"
        )


def check_multi_node(spec: JobSpec) -> None:
    """Before anything starts: DeepSpeed and the launcher's tools are installed, and every --env value
    reaches the other hosts unchanged through DeepSpeed's exports."""
    check_deepspeed()
    missing = [tool for tool in LAUNCHER_TOOLS[spec.ds_launcher] if shutil.which(tool) is None]
    if missing:
        raise LaunchError(
            f"--launcher {spec.ds_launcher} needs {' and '.join(missing)} on this machine, not found on PATH "
            f"({_INSTALL_HINT[spec.ds_launcher]}, or choose another --launcher)"
        )
    for key, value in env_pairs(spec.env).items():
        if value != value.strip() or (
            _SHELL_SPECIAL.search(value) if spec.ds_launcher == "pdsh" else not _PLAIN_VALUE.fullmatch(value)
        ):
            allowed = (
                "no $ ` \" \\ and no surrounding spaces" if spec.ds_launcher == "pdsh"
                else "only letters, digits and @%+=:,./-"
            )
            raise LaunchError(
                f"--env {key}={value!r}: DeepSpeed's {spec.ds_launcher} runner would not pass this value "
                f"unchanged to the other hosts ({allowed})"
            )


def ssh_env(ssh_key: str | None) -> dict[str, str]:
    """pdsh reads extra ssh options from PDSH_SSH_ARGS_APPEND (DeepSpeed appends `-p PORT`)."""
    env = dict(os.environ)
    extra = SSH_CLIENT_OPTS + (f" -i {ssh_key}" if ssh_key else "")
    env["PDSH_SSH_ARGS_APPEND"] = f"{env.get('PDSH_SSH_ARGS_APPEND', '')} {extra}".strip()
    return env


def write_env_file(directory: str, pairs: list[str], env: dict[str, str]) -> None:
    """Variables for every host: DeepSpeed's multi-node runner reads KEY=VAL lines from $DS_ENV_FILE (an
    absolute path is honoured) and exports them on each host. A blank line would crash its parser.
    (Its single-host path reads no env file: the local backend sets the variables itself.)"""
    if pairs:
        path = os.path.join(directory, "deepspeed_env")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(f"{pair}\n" for pair in pairs))
        env["DS_ENV_FILE"] = path


def run(argv: list[str], env: dict[str, str], stop_timeout_s: float) -> int:
    """Run DeepSpeed's runner under a supervisor (nothing of the job outlives it or the launcher) and
    return its exit status, a rank killed by signal N read as 128 + N."""
    status = supervise.run(argv, env, stop_timeout_s)
    rank_signal = {256 - s: s for s in _RANK_SIGNALS}.get(status)
    return 128 + rank_signal if rank_signal else status

"""The `deepspeed` command line for a hostfile, what it needs on this machine, and running it with the
exit status passed through.

On the hosts of the ssh and cml backends DeepSpeed's pdsh runner starts the ranks through one command line
for the remote shell (envpipe_launch.words), with its own working directory in it unquoted. So the runner
runs in `/`, and each rank's first process (RANK_START, given as `--no_python` program with its
arguments quoted by words.argument) goes back into the launcher's working directory with the PYTHONPATH the
runner would have given, then starts the script as DeepSpeed's launch.py does:
`python -u SCRIPT --local_rank=N ARGS`. The MPI launchers carry the working directory and arguments
themselves (argv, no shell).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import signal
import sys

from . import net, supervise, words
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
REMOTE_RUNNER_CWD = "/"  # where the pdsh runner runs: the `cd` it sends every host is then harmless
# A rank's first process on a pdsh host: argv cwd, PYTHONPATH, script, its arguments; LOCAL_RANK from launch.py.
RANK_START = (
    "import os, sys; cwd, path, script, *args = sys.argv[1:]; os.chdir(cwd); os.environ['PYTHONPATH'] = path; "
    "os.execv(sys.executable, [sys.executable, '-u', script, '--local_rank=' + os.environ['LOCAL_RANK'], *args])"
)


def deepspeed_argv(
    spec: JobSpec,
    hostfile: str,
    master_addr: str,
    python: str = sys.executable,
    ssh_key: str | None = None,
    remote_cwd: str | None = None,
) -> list[str]:
    """`--master_addr` is always given: without it DeepSpeed runs `ssh <first host> hostname -I`.
    `remote_cwd` (the launcher's working directory) when the hosts are reached through the launcher
    (ssh, cml): DeepSpeed gets `--force_multi` (it would otherwise run a single host's ranks right here,
    whatever the host is), and with pdsh the ranks start through RANK_START there."""
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
    if remote_cwd is not None:
        argv.append("--force_multi")
    if spec.ds_launcher == "pdsh":
        argv += ["--ssh_port", str(spec.ssh_port)]
    elif spec.ds_launcher == "openmpi":  # its runner ignores --ssh_port: the port goes to mpirun's rsh agent
        rsh = f"-p {spec.ssh_port} {SSH_CLIENT_OPTS}" + (f" -i {ssh_key}" if ssh_key else "")
        argv += ["--launcher_args", f"--allow-run-as-root --mca plm_rsh_args {shlex.quote(rsh)}"]
    # mvapich: DeepSpeed writes its own MVAPICH hostfile; the ssh port must come from ~/.ssh/config
    if remote_cwd is None or spec.ds_launcher != "pdsh":
        return [*argv, spec.script, *spec.script_args]
    start = [python, "-u", "-c", RANK_START, remote_cwd, rank_pythonpath(spec, remote_cwd), spec.script,
             *spec.script_args]
    return [*argv, "--no_python", "--no_local_rank", *map(words.argument, start)]


def rank_pythonpath(spec: JobSpec, cwd: str) -> str:
    """What DeepSpeed's runner gives its ranks run from `cwd`: --env PYTHONPATH (its env file wins), else
    `cwd`, before this environment's PYTHONPATH if there is one."""
    given = env_pairs(spec.env)
    if "PYTHONPATH" in given:
        return given["PYTHONPATH"]
    return f"{cwd}:{os.environ['PYTHONPATH']}" if "PYTHONPATH" in os.environ else cwd


def working_directory() -> str:
    """The launcher's working directory, which the ranks on every host start in."""
    try:
        return os.getcwd()
    except OSError as e:
        raise LaunchError(f"the working directory is gone ({e.strerror or e}): the ranks start in it") from e


def check_deepspeed() -> None:
    """DeepSpeed is importable here (found, not imported: the launcher never imports torch)."""
    if importlib.util.find_spec(RUNNER_PACKAGE) is None:
        raise LaunchError(
            f"this backend runs DeepSpeed's launcher with this Python ({sys.executable}), which has no "
            f"{RUNNER_PACKAGE} module (pip install 'envpipe[train]', or use the kube backend)"
        )


def check_multi_node(spec: JobSpec, ssh_key: str | None = None, python: str = sys.executable) -> None:
    """Before anything starts: DeepSpeed and the launcher's tools are installed, and every word reaches the
    other hosts unchanged (envpipe_launch.words): the --env values, the variables DeepSpeed's runner
    exports from this environment by itself, this Python's path and the ssh key's (which the runner and pdsh
    pass on unquoted), and for the MPI launchers the working directory (in the PYTHONPATH they export)."""
    check_deepspeed()
    launcher = spec.ds_launcher
    missing = [tool for tool in LAUNCHER_TOOLS[launcher] if shutil.which(tool) is None]
    if missing:
        raise LaunchError(
            f"--launcher {launcher} needs {' and '.join(missing)} on this machine, not found on PATH "
            f"({_INSTALL_HINT[launcher]}, or choose another --launcher)"
        )
    given = env_pairs(spec.env)
    words.check_env(given, launcher)
    for key, value in words.runner_exports(os.environ, given).items():
        why = words.inherited_error(value, launcher)
        if why:
            raise LaunchError(f"{key}={value!r} of this environment, which DeepSpeed's runner exports to every "
                              f"host: {why}; set it with --env instead")
    if ssh_key is not None and any(c.isspace() for c in ssh_key):
        raise LaunchError(f"--ssh-key {ssh_key!r}: {launcher} splits ssh's options at white space")
    cwd = working_directory()
    if launcher == "pdsh" and words.shell_word(python) != python:
        raise LaunchError(f"this Python, {python!r}: DeepSpeed's pdsh runner puts its path unquoted into the "
                          "hosts' command line (run envpipe-launch from a Python whose path is plain)")
    if launcher != "pdsh":
        why = words.value_error(rank_pythonpath(spec, cwd), launcher)
        if why:
            raise LaunchError(f"the working directory {cwd!r} (DeepSpeed's {launcher} runner exports it in "
                              f"PYTHONPATH): {why}")


def ssh_env(ssh_key: str | None) -> dict[str, str]:
    """pdsh reads extra ssh options from PDSH_SSH_ARGS_APPEND (DeepSpeed appends `-p PORT`), split at spaces
    and with %h %u %n %% replaced (a % of the key's path doubled)."""
    env = dict(os.environ)
    extra = SSH_CLIENT_OPTS + (f" -i {ssh_key.replace('%', '%%')}" if ssh_key else "")
    env["PDSH_SSH_ARGS_APPEND"] = f"{env.get('PDSH_SSH_ARGS_APPEND', '')} {extra}".strip()
    return env


def write_env_file(directory: str, spec: JobSpec, env: dict[str, str]) -> None:
    """Variables for every host: DeepSpeed's multi-node runner reads KEY=VALUE lines from $DS_ENV_FILE (an
    absolute path is honoured) and exports them on each host (words.env_file). Written even when empty:
    then the runner reads no other (~/.deepspeed_env and ./.deepspeed_env would reach the hosts' shell
    unquoted). (Its single-host path reads no env file: the local backend sets the variables itself.)"""
    path = os.path.join(directory, "deepspeed_env")
    with open(path, "w", encoding="utf-8") as f:
        f.write(words.env_file(env_pairs(spec.env), spec.ds_launcher))
    env["DS_ENV_FILE"] = path


def run(argv: list[str], env: dict[str, str], stop_timeout_s: float, cwd: str | None = None) -> int:
    """Run DeepSpeed's runner (in `cwd`) under a supervisor (nothing of the job outlives it or the launcher)
    and return its exit status, a rank killed by signal N read as 128 + N."""
    status = supervise.run(argv, env, stop_timeout_s, cwd)
    rank_signal = {256 - s: s for s in _RANK_SIGNALS}.get(status)
    return 128 + rank_signal if rank_signal else status

"""`envpipe-launch --nodes N --gpus-per-node G [--backend ...] -- script args`."""

from __future__ import annotations

import sys
from typing import Any

import click

from . import __version__
from .backends import backend
from .command_line import CommandLine
from .errors import LaunchError, Stopped, handling, one_line, raise_stopped
from .job import BACKENDS, DS_LAUNCHERS, MAX_NODES, MAX_PROCS_PER_NODE
from .kube_manifests import DEFAULT_TTL_S, WORKLOADS
from .params import HOST, IMAGE, JOB_NAME, NAMESPACE, QUEUE, EnvPair, RegularFile, Seconds

PORT = click.IntRange(1, 65535)
INT32_SECONDS = 2**31 - 1  # the Job API's fields are int32


class LaunchCommand(click.Command):
    """Every way the command can fail ends in one line on stderr: `envpipe-launch: error: ...`."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]  # click overloads it
        try:
            with handling(raise_stopped):  # SIGINT and SIGTERM unwind through `finally` blocks (cleanup)
                return super().main(*args, **{**kwargs, "standalone_mode": False})
        except click.ClickException as e:  # bad usage: click's message names the option
            _exit(f"error: {e.format_message()}", e.exit_code)
        except Stopped as e:  # the job (if any) is gone already
            _exit(f"interrupted by {e}", e.exit_status)


def _exit(message: str, status: int) -> None:
    click.echo(f"envpipe-launch: {one_line(message)}", err=True)
    sys.exit(status)


@click.command(cls=LaunchCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="envpipe-launch")
@click.option(
    "--nodes", type=click.IntRange(1, MAX_NODES), default=1, show_default=True, help="Number of nodes (workers)."
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(0, MAX_PROCS_PER_NODE),
    default=1,
    show_default=True,
    help="GPUs (= DeepSpeed processes) per node; CPU processes where there is no GPU.",
)
@click.option(
    "--backend", type=click.Choice(BACKENDS), default="local", show_default=True, help="Where the nodes come from."
)
@click.option(
    "--launcher",
    "ds_launcher",
    type=click.Choice(DS_LAUNCHERS),
    default="pdsh",
    show_default=True,
    help="DeepSpeed's multi-node launcher (ssh, cml).",
)
@click.option(
    "--env",
    "env_pairs",
    type=EnvPair(),
    multiple=True,
    help="Environment variable exported on every node (repeatable).",
)
@click.option("--ssh-port", type=PORT, default=2222, show_default=True, help="Port of the workers' sshd.")
@click.option(
    "--master-port",
    type=PORT,
    default=None,
    help="Rendezvous port on the first node [default: a free one where the launcher can tell, else 29500].",
)
@click.option("--master-addr", type=HOST, default=None, help="ssh: rendezvous address [default: the first host].")
@click.option("--hosts", default=None, help="ssh: comma-separated host names or IPv4 addresses.")
@click.option(
    "--hostfile", "hostfile_path", type=RegularFile(), default=None, help="ssh: a DeepSpeed hostfile (host slots=N)."
)
@click.option("--ssh-key", type=RegularFile(), default=None, help="ssh/cml: private key for the workers' sshd.")
@click.option(
    "--connect-timeout",
    type=Seconds(),
    default=30.0,
    show_default=True,
    help="ssh: seconds to wait for each worker's sshd.",
)
@click.option(
    "--stop-timeout",
    type=Seconds(zero_ok=True),
    default=10.0,
    show_default=True,
    help="Seconds the job's processes get to exit after SIGINT/SIGTERM before SIGKILL (local, ssh, cml).",
)
@click.option("--image", type=IMAGE, default=None, help="kube: worker image (needs sshd, python, deepspeed).")
@click.option("--namespace", type=NAMESPACE, default="default", show_default=True, help="kube: namespace.")
@click.option("--name", type=JOB_NAME, default=None, help="kube: job name [default: envpipe-<random>].")
@click.option("--cpu", "cpu_only", is_flag=True, help="kube: allow a CPU-only job (no nvidia.com/gpu).")
@click.option(
    "--ready-timeout",
    type=Seconds(),
    default=600.0,
    show_default=True,
    help="kube/cml: seconds to wait for all workers.",
)
@click.option(
    "--workload",
    type=click.Choice(list(WORKLOADS)),
    default="job",
    show_default=True,
    help="kube: the nodes as an Indexed batch/v1 Job, or a JobSet (where the cluster runs the JobSet controller).",
)
@click.option(
    "--queue",
    type=QUEUE,
    default=None,
    help="kube: Kueue LocalQueue; the job is created suspended and starts, all pods at once, when Kueue admits it.",
)
@click.option(
    "--ttl-after-finished",
    type=click.IntRange(0, INT32_SECONDS),
    default=DEFAULT_TTL_S,
    show_default=True,
    help="kube: seconds the cluster keeps a finished job (with --keep, or after a killed launcher) before deleting it.",
)
@click.option(
    "--active-deadline",
    type=click.IntRange(1, INT32_SECONDS),
    default=None,
    help="kube: seconds a started job may run before the cluster fails it [default: no limit].",
)
@click.option("--keep", is_flag=True, help="kube: keep the job's objects after it ends (until --ttl-after-finished).")
@click.option("--dry-run", is_flag=True, help="kube: print the manifests (for kubectl apply -f) and exit.")
@click.option("--no-ssh", "no_ssh", is_flag=True, help="kube: DeepSpeed's ssh-free mode (--no_ssh on every node).")
@click.option(
    "--ssh-secret",
    default=None,
    metavar="NAME",
    help="kube: a Secret of yours with ssh-privatekey and authorized_keys for the nodes' ssh [default: the "
    "launcher makes one per job; --dry-run prints none].",
)
@click.option(
    "--worker-cpu", type=click.IntRange(1, 1024), default=4, show_default=True, help="cml/kube: vCPUs per worker."
)
@click.option(
    "--worker-memory", type=click.IntRange(1, 65536), default=16, show_default=True, help="cml/kube: GiB per worker."
)
@click.option(
    "--shm-size", type=int, default=4, show_default=True, help="kube: GiB of memory-backed /dev/shm per worker."
)
@click.option("--node-selector", multiple=True, metavar="KEY=VAL", help="kube: worker node label (repeatable).")
@click.option(
    "--toleration", multiple=True, metavar="KEY[=VAL][:EFFECT]", help="kube: worker toleration (repeatable)."
)
@click.option("--affinity", "affinity_file", type=RegularFile(), default=None,
              help="kube: YAML/JSON file of the workers' affinity.")
@click.option("--image-pull-secret", multiple=True, metavar="NAME", help="kube: pull secret (repeatable).")
@click.option("--priority-class", default=None, help="kube: priorityClassName of the pods.")
@click.option(
    "--clockd-dir", default=None, help="kube: host directory of envpipe-clockd's socket (chart socket.hostDir)."
)
@click.option("--clockd-gid", type=int, default=None, help="kube: group of that socket (chart socket.gid).")
@click.option("--no-clockd", is_flag=True, help="kube: no clock control: workers do not mount clockd's socket.")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def main(**params: Any) -> None:  # click passes the parameters by name; CommandLine types them
    """Start a (multi-node) DeepSpeed/EnvPipe job and exit with its exit code.

    SCRIPT is the training script (a path on the workers for kube), SCRIPT_ARGS its arguments; put
    `--` before SCRIPT when they start with '-'.

    A job stopped by SIGINT or SIGTERM exits 128 + the signal (130, 143); bad input exits 2 with one line.
    """
    args = CommandLine(**params)
    try:
        spec = args.spec().validate()
        chosen = backend(args.backend)
        code = chosen.launch(spec, chosen.options(args))
    except LaunchError as e:
        _exit(f"error: {e}", 2)
    sys.exit(code)

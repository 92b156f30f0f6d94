"""ssh: existing hosts (a hostfile or --hosts); DeepSpeed fans out with pdsh or OpenMPI over ssh."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from .. import deepspeed_cmd, hostfile, net
from ..command_line import CommandLine
from ..errors import LaunchError
from ..job import JobSpec


@dataclass(frozen=True)
class Reach:
    """How DeepSpeed's runner reaches the hosts: the ssh key (None: ssh's own), the rendezvous address (None: the
    first host) and how long each host's sshd may take to answer."""

    ssh_key: str | None = None
    master_addr: str | None = None
    connect_timeout_s: float = 10.0


@dataclass(frozen=True)
class SshOptions:
    hosts_csv: str | None  # --hosts
    hostfile_path: str | None  # --hostfile
    reach: Reach = Reach()


def options(args: CommandLine) -> SshOptions:
    return SshOptions(args.hosts, args.hostfile_path, Reach(args.ssh_key, args.master_addr, args.connect_timeout))


def hosts_from(spec: JobSpec, hosts_csv: str | None, hostfile_path: str | None) -> list[hostfile.Host]:
    if bool(hosts_csv) == bool(hostfile_path):
        raise LaunchError("the ssh backend needs exactly one of --hosts or --hostfile")
    if hostfile_path:
        hosts = hostfile.read(hostfile_path)
    else:
        names = [h.strip() for h in (hosts_csv or "").split(",")]
        hosts = hostfile.check([hostfile.Host(n, spec.gpus_per_node) for n in names])
    if len(hosts) < spec.nodes:
        raise LaunchError(f"--nodes {spec.nodes} but only {len(hosts)} host(s) given")
    return hosts[: spec.nodes]


def run_on_hosts(spec: JobSpec, hosts: list[hostfile.Host], reach: Reach) -> int:
    """Check every sshd, render the hostfile, start DeepSpeed on the hosts (even on one: it would run a
    single host's ranks here otherwise), from this working directory; shared with the cml backend, which
    checked the tools and the words (deepspeed_cmd.check_multi_node) already."""
    cwd = deepspeed_cmd.working_directory()
    for h in hosts:
        net.wait_for_port(h.host, spec.ssh_port, reach.connect_timeout_s)
    with tempfile.TemporaryDirectory(prefix="envpipe-launch-") as tmp:
        path = os.path.join(tmp, "hostfile")
        fmt = "openmpi" if spec.ds_launcher == "openmpi" else "deepspeed"
        with open(path, "w") as f:
            f.write(hostfile.render(hosts, fmt))
        argv = deepspeed_cmd.deepspeed_argv(spec, path, reach.master_addr or hosts[0].host, ssh_key=reach.ssh_key,
                                            remote_cwd=cwd)
        env = deepspeed_cmd.ssh_env(reach.ssh_key)
        deepspeed_cmd.write_env_file(tmp, spec, env)
        runner_cwd = deepspeed_cmd.REMOTE_RUNNER_CWD if spec.ds_launcher == "pdsh" else cwd
        return deepspeed_cmd.run(argv, env, spec.stop_timeout_s, runner_cwd)


def launch(spec: JobSpec, opts: SshOptions) -> int:
    hosts = hosts_from(spec, opts.hosts_csv, opts.hostfile_path)
    deepspeed_cmd.check_multi_node(spec, opts.reach.ssh_key)
    return run_on_hosts(spec, hosts, opts.reach)

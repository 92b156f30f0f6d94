"""The parsed command line, typed: every parameter of `cli.main` by the name click gives it.

`spec()` is the job every backend shares; each backend reads the options only it uses (`Backend.options`).
Each value was checked where click parsed it (envpipe_launch.params); what depends on several values is
checked by the job (`JobSpec.validate`) or by the backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from .job import JobSpec


@dataclass(frozen=True)
class CommandLine:
    nodes: int
    gpus_per_node: int
    backend: str
    ds_launcher: str  # --launcher
    env_pairs: tuple[str, ...]  # --env
    ssh_port: int
    master_port: int | None
    master_addr: str | None
    hosts: str | None
    hostfile_path: str | None  # --hostfile
    ssh_key: str | None
    connect_timeout: float
    stop_timeout: float
    image: str | None
    namespace: str
    name: str | None
    cpu_only: bool  # --cpu
    ready_timeout: float
    workload: str
    queue: str | None
    ttl_after_finished: int
    active_deadline: int | None
    keep: bool
    dry_run: bool
    no_ssh: bool
    ssh_secret: str | None
    worker_cpu: int
    worker_memory: int
    shm_size: int
    node_selector: tuple[str, ...]
    toleration: tuple[str, ...]
    affinity_file: str | None  # --affinity
    image_pull_secret: tuple[str, ...]
    priority_class: str | None
    clockd_dir: str | None
    clockd_gid: int | None
    no_clockd: bool
    script: str
    script_args: tuple[str, ...]

    def spec(self) -> JobSpec:
        """The job, not yet validated (JobSpec.validate)."""
        return JobSpec(
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            script=self.script,
            script_args=self.script_args,
            backend=self.backend,
            ds_launcher=self.ds_launcher,
            env=self.env_pairs,
            ssh_port=self.ssh_port,
            master_port=self.master_port,
            script_on_workers=self.backend == "kube",
            stop_timeout_s=self.stop_timeout,
        )

"""envpipe-launch: start multi-node DeepSpeed jobs (local, ssh, kube, cml) from hostfile templates.

Importing this package never imports torch or deepspeed: jobs are started as subprocesses or pods.

One path through it: `cli` parses the command line (each value checked as it is parsed by a type of `params`)
into a typed `command_line.CommandLine`, which gives the job every backend shares (`job.JobSpec`); `cli` then
dispatches to the backend asked for (`backends.backend(name)`, a `backends.Backend`), which reads its own options
from the command line (`options(args)`) and runs the job (`launch(spec, opts)`, the job's exit status). The rest,
by what it serves:

- `backends/`: `local` (one node), `ssh` (existing hosts), `cml` (CML workers, then as ssh), `kube` (the options
  checked, the dry run) with `kube_run` (one job's life on the cluster);
- DeepSpeed on hosts: `deepspeed_cmd` (its command line, its tools, running it), `words` (every word that reaches
  a remote shell, quoted or refused), `hostfile` (rendered and checked), `net` (ports), `sshkeys`;
- Kubernetes as data: `kube_manifests` (the job's objects), `kube_syntax` (names, image references),
  `kube_version` (what a cluster's version allows), `pod_contract` (what the image, the clockd chart and the pods
  agree on);
- processes and ends: `supervise` and `proctree` (nothing outlives the launcher), `errors` (one line, exit
  statuses, signals), `progress`, `textfile`.
"""

__version__ = "0.1.0"

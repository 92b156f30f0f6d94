"""The Kubernetes objects of one job, as plain dicts (printed by --dry-run, sent by the kube backend).

A job is a batch workload that the cluster's own machinery runs, queues and cleans up (the shape of
Kubeflow Trainer's DeepSpeed runtime on JobSet, and of mpi-operator's objects):

- the workload `<job>`: an Indexed batch/v1 Job with one pod per node (`--workload job`), or a JobSet
  whose one replicated Job `node` is that same Job (`--workload jobset`, where the cluster runs the
  JobSet controller); the Job controller names each pod's host `<Job name>-<index>`, reachable as
  `<host>.<job>` through the headless Service `<job>`;
- with ssh (the default) every node runs the image's sshd and node 0 (JOB_COMPLETION_INDEX 0) is
  also the launcher (Trainer's "launcher as a node"): the image's `node` mode starts sshd, then node 0
  waits for every node's sshd, bounded, and runs `deepspeed --launcher pdsh` against them. Node 0's end
  ends the job: the other nodes, which only serve ssh, stop once node 0's sshd is gone (the entrypoint,
  told where node 0 is), on any Kubernetes; where the API server serves it (1.31+, kube_version.py) the
  Job's successPolicy also ends the job the moment node 0 succeeds. With --no-ssh every node runs
  `deepspeed --no_ssh --node_rank=$JOB_COMPLETION_INDEX`, and all must succeed;
- one failed pod fails the whole job at once: backoffLimit 0 and a podFailurePolicy that fails the
  Job on a non-zero exit and on a disruption (node drain, preemption). A DeepSpeed job is not
  elastic: a replaced pod has lost its ranks and the rendezvous, so retries would only hold GPUs;
- with a Kueue queue the workload carries `kueue.x-k8s.io/queue-name` and is created suspended:
  Kueue admits the whole job at once (one Workload, every pod) and unsuspends it;
- ttlSecondsAfterFinished: the cluster deletes a finished job even when no launcher is left to do it;
- the Secret (the job's ssh key, made by the launcher when it creates the job), the ConfigMap (hostfile,
  DeepSpeed's env file) and, for a Job, the headless Service (a JobSet's controller makes its own) are owned
  by the workload (`owned_by`, once the launcher knows the workload's uid), so deleting the workload deletes
  everything. A Secret the user made (`--ssh-secret NAME`) is only mounted, never created or deleted.

Every object is complete before anything exists on the cluster (names come from the job name, hosts
from the Job controller's naming), so `--dry-run` prints objects that `kubectl apply` accepts as they
are; only the owner references must wait for the workload's uid. A key is never printed: the printed
objects mount the ssh Secret by name, one the user creates (docs/launcher.md).
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field
from typing import Any

from . import hostfile, words
from .deepspeed_cmd import SSH_CLIENT_OPTS
from .job import DEFAULT_MASTER_PORT, JobSpec, env_pairs
from .kube_syntax import escape_expansion
from .pod_contract import LAUNCHER_NODE_ENV, RUNTIME_GID, RUNTIME_UID, SOCKET_ENV, ClockdSocket
from .sshkeys import KeyPair

LABEL = "envpipe.io/job"
ROLE = "envpipe.io/role"
LAUNCH = "envpipe.io/launch"  # one launch's objects: what it may delete of what it asked to create
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # set on each pod by the Job controller
SSH_DIR = "/etc/envpipe/ssh"  # the image's entrypoint reads authorized_keys and id_ed25519 here
JOB_DIR = "/etc/envpipe/job"  # hostfile and deepspeed_env
CONTAINER = "node"
REPLICATED_JOB = "node"  # the JobSet's one replicated Job
DEFAULT_TTL_S = 86_400  # a finished job stays a day (its pods' logs), then the cluster deletes it
Obj = dict[str, Any]


# DeepSpeed's pdsh runner puts its working directory (the image's) unquoted into the nodes' command line: node 0
# refuses one that a shell or pdsh would read otherwise (the words the launcher writes are quoted: words.py).
PLAIN_WORKDIR = (
    'case "$PWD" in *[!A-Za-z0-9_@+=:,./-]*) echo "envpipe: the working directory ${PWD@Q} would reach the other '
    "nodes' shell unquoted through DeepSpeed's pdsh runner; use an image whose WORKDIR is letters, digits and "
    '_@+=:,./-" >&2; exit 2;; esac'
)


@dataclass(frozen=True)
class WorkloadKind:
    """The API of a workload kind, and the condition types that end it."""

    kind: str
    group: str
    version: str
    plural: str
    succeeded: str  # condition type of success; failure is "Failed" for both

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


JOB = WorkloadKind("Job", "batch", "v1", "jobs", "Complete")
JOBSET = WorkloadKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", "Completed")
WORKLOADS = {"job": JOB, "jobset": JOBSET}


@dataclass(frozen=True)
class Batch:
    """What the cluster's batch machinery gets: the workload kind, the queue, the time limits."""

    workload: str = "job"  # a key of WORKLOADS
    queue: str | None = None  # Kueue LocalQueue in the job's namespace
    ttl_after_finished_s: int = DEFAULT_TTL_S
    active_deadline_s: int | None = None  # running time after which the cluster fails the job

    @property
    def kind(self) -> WorkloadKind:
        return WORKLOADS[self.workload]


@dataclass(frozen=True)
class PodSettings:
    """What every pod gets besides the job itself: resources, placement, the clockd socket."""

    cpu: str = "4"
    memory_gib: int = 16
    shm_gib: int = 4  # /dev/shm, memory-backed: counts against memory_gib
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Obj, ...] = ()
    affinity: Obj | None = None
    image_pull_secrets: tuple[str, ...] = ()
    priority_class: str | None = None
    clockd: ClockdSocket | None = field(default_factory=ClockdSocket)  # None: no clock control, no hostPath


@dataclass
class KubeJob:
    spec: JobSpec
    name: str
    namespace: str
    image: str
    no_ssh: bool = False
    pods: PodSettings = field(default_factory=PodSettings)
    batch: Batch = field(default_factory=Batch)
    worker_wait_s: int = 600  # how long node 0 waits for every node's sshd
    launch: str | None = None  # this launch's id (label LAUNCH of every object; none in a dry run)
    ssh_secret: str | None = None  # a Secret the user made (ssh-privatekey, authorized_keys); None: the job's own
    success_policy: bool = False  # the API server serves Job successPolicy (kube_version.SUCCESS_POLICY)

    @property
    def kind(self) -> WorkloadKind:
        return self.batch.kind

    @property
    def secret_name(self) -> str:
        return self.ssh_secret or f"{self.name}-ssh"

    @property
    def makes_secret(self) -> bool:
        """Whether the launcher creates the job's ssh Secret (ssh mode, no --ssh-secret)."""
        return not self.no_ssh and self.ssh_secret is None

    def hostname(self, index: int) -> str:
        """The host name the Job controller gives node `index`: <Job name>-<index>, where a JobSet's
        Job is <jobset>-<replicated job>-<job index>."""
        job = self.name if self.kind is JOB else f"{self.name}-{REPLICATED_JOB}-0"
        return f"{job}-{index}"

    def hosts(self) -> list[str]:
        return [f"{self.hostname(i)}.{self.name}" for i in range(self.spec.nodes)]

    def hostfile(self) -> str:
        return hostfile.render([hostfile.Host(h, max(self.spec.gpus_per_node, 1)) for h in self.hosts()])

    def meta(self, name: str, role: str) -> Obj:
        labels = {LABEL: self.name, ROLE: role, **({LAUNCH: self.launch} if self.launch else {})}
        return {"name": name, "namespace": self.namespace, "labels": labels}

    def pod_labels(self) -> dict[str, str]:
        return {LABEL: self.name, ROLE: "node"}

    # ---- the objects the workload owns ----
    def secret(self, keys: KeyPair) -> Obj:
        """The job's own ssh Secret, made when the launcher creates the job (never printed)."""
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/ssh-auth",
            "metadata": self.meta(self.secret_name, "ssh"),
            "stringData": {"ssh-privatekey": keys.private, "ssh-publickey": keys.public,
                           "authorized_keys": keys.public},
        }

    def config_map(self) -> Obj:
        """The hostfile, and with ssh the --env variables that DeepSpeed's runner exports on every node
        (words.env_file; with --no-ssh they are the container's env)."""
        data = {"hostfile": self.hostfile()}
        if self.spec.env and not self.no_ssh:
            data["deepspeed_env"] = words.env_file(env_pairs(self.spec.env), words.PDSH)
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(f"{self.name}-config", "config"),
                "data": data}

    def service(self) -> Obj:
        """Headless: the DNS names <host>.<job> of every node, ready or not (a Job's; a JobSet makes its own)."""
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(self.name, "dns"),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": self.pod_labels(),
                "ports": [{"name": "ssh", "port": self.spec.ssh_port}],
            },
        }

    def dependents(self, keys: KeyPair | None) -> list[Obj]:
        """What the workload owns, in creation order: the job's own ssh Secret where ``keys`` are given (the
        launcher's create), the ConfigMap, a Job's headless Service."""
        objs = [self.secret(keys)] if keys is not None and self.makes_secret else []
        objs.append(self.config_map())
        if self.kind is JOB:
            objs.append(self.service())
        return objs

    def manifests(self) -> list[Obj]:
        """Everything but key material, for `kubectl apply -f`: the workload last, so its pods find what they
        mount (the ssh Secret, `secret_name`, exists before: the user makes it). Suspended only for Kueue to
        admit; without a queue the job starts when applied."""
        return [*self.dependents(None), self.workload(suspend=self.batch.queue is not None)]

    def owned_by(self, obj: Obj, owner_uid: str) -> Obj:
        """A copy of obj that the garbage collector deletes with the workload."""
        out = copy.deepcopy(obj)
        out["metadata"]["ownerReferences"] = [
            {
                "apiVersion": self.kind.api_version,
                "kind": self.kind.kind,
                "name": self.name,
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        return out

    # ---- the workload ----
    def workload(self, suspend: bool) -> Obj:
        meta = self.meta(self.name, "job")
        if self.batch.queue:
            meta["labels"][QUEUE_LABEL] = self.batch.queue
        common = {"suspend": suspend, "ttlSecondsAfterFinished": self.batch.ttl_after_finished_s}
        if self.kind is JOB:
            return {"apiVersion": JOB.api_version, "kind": "Job", "metadata": meta,
                    "spec": {**common, **self.job_spec()}}
        spec = {
            **common,
            # the JobSet controller makes the headless Service <job> and sets the pods' subdomain
            "network": {"enableDNSHostnames": True, "subdomain": self.name, "publishNotReadyAddresses": True},
            # no failurePolicy: the first failed Job fails the JobSet, which deletes its other Jobs
            "replicatedJobs": [
                {"name": REPLICATED_JOB, "replicas": 1,
                 "template": {"metadata": {"labels": self.pod_labels()}, "spec": self.job_spec()}}
            ],
        }
        return {"apiVersion": JOBSET.api_version, "kind": "JobSet", "metadata": meta, "spec": spec}

    def job_spec(self) -> Obj:
        n = self.spec.nodes
        spec: Obj = {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "backoffLimit": 0,
            # rules match in order: a drained or preempted pod (which also exits non-zero) is named as such.
            # An exit-code rule names no pod condition: an empty list, which Kubernetes 1.27's schema requires
            # (the field lost its `required` in 1.28; the API server takes [] with onExitCodes in every version)
            "podFailurePolicy": {
                "rules": [
                    {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    {"action": "FailJob", "onPodConditions": [],
                     "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]}},
                ]
            },
        }
        if not self.no_ssh and self.success_policy:  # node 0 is the launcher: its success is the job's
            spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
        if self.batch.active_deadline_s is not None:
            spec["activeDeadlineSeconds"] = self.batch.active_deadline_s
        spec["template"] = self.pod_template()
        return spec

    # ---- the pods ----
    def _deepspeed(self, extra: str) -> str:
        """DeepSpeed's runner for node 0's `bash -c` (words.posix); with ssh the script and its arguments are
        first quoted for its pdsh runner's command line (words.shell_word, words.argument)."""
        head = ["deepspeed", "--hostfile", f"{JOB_DIR}/hostfile", "--master_addr", self.hosts()[0],
                # a pod's network is its own: the default port is free there
                "--master_port", str(self.spec.master_port or DEFAULT_MASTER_PORT)]
        program = [self.spec.script, *self.spec.script_args]
        if not self.no_ssh:
            program = [words.shell_word(self.spec.script), *map(words.argument, self.spec.script_args)]
        return f"{shlex.join(head)} {extra} {' '.join(map(words.posix, program))}"

    def _wait_for_nodes(self) -> str:
        """Bash: every node's sshd answers (DNS and port), bounded, before DeepSpeed starts."""
        hosts = " ".join(self.hosts())
        port, wait = self.spec.ssh_port, self.worker_wait_s
        return (
            f"deadline=$((SECONDS + {wait})); for h in {hosts}; do "
            f"until (exec 3<>/dev/tcp/$h/{port}) 2>/dev/null; do "
            f'if [ $SECONDS -ge $deadline ]; then echo "node $h:{port} unreachable after {wait}s" >&2; '
            "exit 1; fi; sleep 1; done; done"
        )

    def command(self) -> list[str]:
        """The container's args after the image's entrypoint."""
        if self.no_ssh:  # every node runs DeepSpeed itself, torchrun-style
            ds = self._deepspeed("--no_ssh --node_rank=$JOB_COMPLETION_INDEX")
            return ["launcher", "bash", "-c", f"exec {ds}"]
        # --force_multi: through pdsh even to one node, whose words are quoted for that command line
        ds = self._deepspeed(shlex.join(["--launcher", "pdsh", "--ssh_port", str(self.spec.ssh_port),
                                         "--no_ssh_check", "--force_multi"]))
        return ["node", "bash", "-c", f"{self._wait_for_nodes()}; {PLAIN_WORKDIR}; exec {ds}"]  # on node 0 only

    def _env(self) -> list[Obj]:
        env: list[Obj] = [
            {"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for var, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                              ("POD_UID", "metadata.uid"))
        ]
        if self.pods.clockd:
            env.append({"name": SOCKET_ENV, "value": self.pods.clockd.path})
        if self.no_ssh:  # the container env is the job's
            env += [{"name": k, "value": v} for k, v in env_pairs(self.spec.env).items()]
        else:  # node 0's pdsh and DeepSpeed's runner; where node 0 is, for the other nodes to end with it
            env.append({"name": "PDSH_SSH_ARGS_APPEND", "value": SSH_CLIENT_OPTS})
            env.append({"name": LAUNCHER_NODE_ENV, "value": f"{self.hosts()[0]}:{self.spec.ssh_port}"})
            if self.spec.env:
                env.append({"name": "DS_ENV_FILE", "value": f"{JOB_DIR}/deepspeed_env"})
        # the kubelet expands $(VAR) and $$ in env values: every $ meant literally is doubled
        return [{**e, "value": escape_expansion(e["value"])} if "value" in e else e for e in env]

    def _volumes(self) -> tuple[list[Obj], list[Obj]]:
        shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{self.pods.shm_gib}Gi"}}
        volumes = [shm, {"name": "job", "configMap": {"name": f"{self.name}-config"}}]
        mounts: list[Obj] = [{"name": "dshm", "mountPath": "/dev/shm"},
                             {"name": "job", "mountPath": JOB_DIR, "readOnly": True}]
        if not self.no_ssh:
            items = [{"key": "ssh-privatekey", "path": "id_ed25519"},
                     {"key": "authorized_keys", "path": "authorized_keys"}]
            volumes.append({"name": "ssh", "secret": {"secretName": self.secret_name, "defaultMode": 0o440,
                                                      "items": items}})
            mounts.append({"name": "ssh", "mountPath": SSH_DIR, "readOnly": True})
        if self.pods.clockd:
            volumes.append({"name": "clockd",
                            "hostPath": {"path": self.pods.clockd.host_dir, "type": "DirectoryOrCreate"}})
            mounts.append({"name": "clockd", "mountPath": self.pods.clockd.host_dir, "readOnly": True})
        return volumes, mounts

    def _container(self) -> Obj:
        s, pods = self.spec, self.pods
        _, mounts = self._volumes()
        memory = f"{pods.memory_gib}Gi"
        limits: Obj = {"cpu": pods.cpu, "memory": memory}
        if s.gpus_per_node > 0:
            limits["nvidia.com/gpu"] = str(s.gpus_per_node)
        container: Obj = {
            "name": CONTAINER,
            "image": self.image,
            # the image's entrypoint (tini, envpipe-entrypoint) stays in charge; the kubelet expands
            # $(VAR) and $$ in args, so every $ meant literally is doubled
            "args": [escape_expansion(a) for a in self.command()],
            "env": self._env(),
            "volumeMounts": mounts,
            "resources": {"requests": {"cpu": pods.cpu, "memory": memory}, "limits": limits},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True,
            },
        }
        if not self.no_ssh:
            container["ports"] = [{"name": "ssh", "containerPort": s.ssh_port}]
            container["readinessProbe"] = {"tcpSocket": {"port": s.ssh_port}, "periodSeconds": 2}
        return container

    def pod_template(self) -> Obj:
        pods = self.pods
        groups = [pods.clockd.gid] if pods.clockd else []
        volumes, _ = self._volumes()
        spec: Obj = {
            "restartPolicy": "Never",  # the Job, not the kubelet, decides about failures
            "automountServiceAccountToken": False,  # the pods never call the API server
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNTIME_UID,
                "runAsGroup": RUNTIME_GID,
                "fsGroup": RUNTIME_GID,  # the ssh Secret's files become readable by the user
                **({"supplementalGroups": groups} if groups else {}),
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [self._container()],
            "volumes": volumes,
        }
        if self.kind is JOB:
            spec["subdomain"] = self.name  # the Job controller sets hostname <job>-<index>
        if pods.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": s} for s in pods.image_pull_secrets]
        if pods.priority_class:
            spec["priorityClassName"] = pods.priority_class
        if pods.node_selector:
            spec["nodeSelector"] = dict(pods.node_selector)
        if pods.tolerations:
            spec["tolerations"] = copy.deepcopy(list(pods.tolerations))
        if pods.affinity:
            spec["affinity"] = copy.deepcopy(pods.affinity)
        return {"metadata": {"labels": self.pod_labels()}, "spec": spec}

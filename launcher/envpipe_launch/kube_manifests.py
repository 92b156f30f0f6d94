"""The Kubernetes objects of one job, as plain dicts (printed by --dry-run, sent by the kube backend).

Every object is complete before anything exists on the cluster: names come from the job name, workers
are addressed by their DNS names under the job's headless Service (<job>-worker-<i>.<job>), and the
launcher pod waits for the workers' sshd itself. So `--dry-run` prints objects that `kubectl apply`
accepts as they are. One ConfigMap named after the job is the job object; when the launcher creates
the others it adds an ownerReference to it (`owned_by`), so deleting it (`kubectl delete cm <job>`)
lets the garbage collector remove everything. Objects applied from a dry run carry no owner: delete
them by label (`kubectl delete pod,svc,secret,cm -l envpipe.io/job=<job>`).

Pods are bare Pods with restartPolicy Never, not an Indexed Job or JobSet: a DeepSpeed job is not
elastic (a replaced worker has lost its ranks and the rendezvous), so a controller's restarts would
only hold GPUs; the launcher gang-waits with a deadline and removes the whole job on any failure.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from . import hostfile
from .deepspeed_cmd import SSH_CLIENT_OPTS
from .job import DEFAULT_MASTER_PORT, JobSpec
from .kube_syntax import escape_expansion
from .pod_contract import RUNTIME_GID, RUNTIME_UID, SOCKET_ENV, ClockdSocket

LABEL = "envpipe.io/job"
ROLE = "envpipe.io/role"
SSH_DIR = "/etc/envpipe/ssh"  # the image's entrypoint reads authorized_keys and id_ed25519 here
JOB_DIR = "/etc/envpipe/job"  # hostfile and deepspeed_env
LAUNCHER_CPU = "1"
LAUNCHER_MEMORY = "2Gi"
Obj = dict[str, Any]


@dataclass(frozen=True)
class PodSettings:
    """What every worker pod gets besides the job itself: resources, placement, the clockd socket."""

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
    worker_wait_s: int = 600  # how long the launcher pod waits for the workers' sshd

    def worker(self, i: int) -> str:
        return f"{self.name}-worker-{i}"

    def launcher(self) -> str:
        return f"{self.name}-launcher"

    def meta(self, name: str, role: str) -> Obj:
        return {"name": name, "namespace": self.namespace, "labels": {LABEL: self.name, ROLE: role}}

    def job_object(self) -> Obj:
        desc = {
            "nodes": self.spec.nodes,
            "gpusPerNode": self.spec.gpus_per_node,
            "image": self.image,
            "script": self.spec.script,
            "args": self.spec.script_args,
            "noSsh": self.no_ssh,
        }
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.meta(self.name, "job"),
            "data": {"job.json": json.dumps(desc)},
        }

    def ssh_secret(self, private: str, public: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/ssh-auth",
            "metadata": self.meta(f"{self.name}-ssh", "ssh"),
            "stringData": {"ssh-privatekey": private, "ssh-publickey": public, "authorized_keys": public},
        }

    def service(self) -> Obj:
        # Headless: stable DNS names <pod>.<job> for every worker, ready or not.
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(self.name, "dns"),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {LABEL: self.name, ROLE: "worker"},
                "ports": [{"name": "ssh", "port": self.spec.ssh_port}],
            },
        }

    def hosts(self) -> list[str]:
        return [f"{self.worker(i)}.{self.name}" for i in range(self.spec.nodes)]

    def hostfile(self) -> str:
        return hostfile.render([hostfile.Host(h, max(self.spec.gpus_per_node, 1)) for h in self.hosts()])

    def job_files(self) -> Obj:
        """The hostfile, and the --env variables that DeepSpeed's runner exports on every node."""
        data = {"hostfile": self.hostfile()}
        if self.spec.env:
            data["deepspeed_env"] = "".join(f"{pair.strip()}\n" for pair in self.spec.env)
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.meta(f"{self.name}-job", "files"),
            "data": data,
        }

    def _deepspeed(self, extra: list[str]) -> str:
        argv = [
            "deepspeed",
            "--hostfile",
            f"{JOB_DIR}/hostfile",
            "--master_addr",
            self.hosts()[0],
            "--master_port",
            str(self.spec.master_port or DEFAULT_MASTER_PORT),  # a pod's network is its own: free there
            *extra,
            self.spec.script,
            *self.spec.script_args,
        ]
        return shlex.join(argv)

    def _wait_for_workers(self) -> str:
        """Bash: every worker's sshd answers (DNS and port), bounded, before DeepSpeed starts."""
        hosts = " ".join(self.hosts())
        port = self.spec.ssh_port
        return (
            f"deadline=$((SECONDS + {self.worker_wait_s})); for h in {hosts}; do "
            f"until (exec 3<>/dev/tcp/$h/{port}) 2>/dev/null; do "
            f'if [ $SECONDS -ge $deadline ]; then echo "worker $h:{port} unreachable after {self.worker_wait_s}s" >&2; '
            "exit 1; fi; sleep 1; done; done"
        )

    def _pod(self, name: str, role: str, container: Obj, volumes: list[Obj], gpu_node: bool) -> Obj:
        groups = [self.pods.clockd.gid] if gpu_node and self.pods.clockd else []
        spec: Obj = {
            "restartPolicy": "Never",
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
            "containers": [container],
            "volumes": volumes,
        }
        if self.pods.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": s} for s in self.pods.image_pull_secrets]
        if self.pods.priority_class:
            spec["priorityClassName"] = self.pods.priority_class
        if gpu_node:
            if self.pods.node_selector:
                spec["nodeSelector"] = dict(self.pods.node_selector)
            if self.pods.tolerations:
                spec["tolerations"] = copy.deepcopy(list(self.pods.tolerations))
            if self.pods.affinity:
                spec["affinity"] = copy.deepcopy(self.pods.affinity)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": self.meta(name, role), "spec": spec}

    def _container(self, name: str, args: list[str], env: list[Obj], mounts: list[Obj], resources: Obj) -> Obj:
        return {
            "name": name,
            "image": self.image,
            # the image's entrypoint (tini, envpipe-entrypoint) stays in charge; the kubelet expands
            # $(VAR) and $$ in args and env values, so every $ meant literally is doubled
            "args": [escape_expansion(a) for a in args],
            "env": [{**e, "value": escape_expansion(e["value"])} if "value" in e else e for e in env],
            "volumeMounts": mounts,
            "resources": resources,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True,
            },
        }

    def _ssh_volume(self) -> Obj:
        items = [{"key": "ssh-privatekey", "path": "id_ed25519"}, {"key": "authorized_keys", "path": "authorized_keys"}]
        return {"name": "ssh", "secret": {"secretName": f"{self.name}-ssh", "defaultMode": 0o440, "items": items}}

    def _job_files_volume(self) -> Obj:
        return {"name": "job", "configMap": {"name": f"{self.name}-job"}}

    def worker_pod(self, i: int) -> Obj:
        s, pods = self.spec, self.pods
        env: list[Obj] = [
            {"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for var, path in (
                ("POD_NAME", "metadata.name"),
                ("POD_NAMESPACE", "metadata.namespace"),
                ("POD_UID", "metadata.uid"),
            )
        ]
        shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{pods.shm_gib}Gi"}}
        volumes = [self._ssh_volume(), shm]
        mounts: list[Obj] = [
            {"name": "ssh", "mountPath": SSH_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ]
        if pods.clockd:
            env.append({"name": SOCKET_ENV, "value": pods.clockd.path})
            volumes.append({"name": "clockd", "hostPath": {"path": pods.clockd.host_dir, "type": "DirectoryOrCreate"}})
            mounts.append({"name": "clockd", "mountPath": pods.clockd.host_dir, "readOnly": True})
        if self.no_ssh:  # every node runs DeepSpeed itself, torchrun-style; the container env is the job's
            env += [{"name": k, "value": v} for k, _, v in (p.partition("=") for p in s.env)]
            args = ["launcher", "bash", "-c", self._deepspeed(["--no_ssh", f"--node_rank={i}"])]
            volumes.append(self._job_files_volume())
            mounts.append({"name": "job", "mountPath": JOB_DIR, "readOnly": True})
        else:
            args = ["worker"]  # sshd on the image's port 2222, keys from SSH_DIR
        memory = f"{pods.memory_gib}Gi"
        limits: Obj = {"cpu": pods.cpu, "memory": memory}
        if s.gpus_per_node > 0:
            limits["nvidia.com/gpu"] = str(s.gpus_per_node)
        container = self._container(
            "worker", args, env, mounts, {"requests": {"cpu": pods.cpu, "memory": memory}, "limits": limits}
        )
        container["ports"] = [{"name": "ssh", "containerPort": s.ssh_port}]
        if not self.no_ssh:
            container["readinessProbe"] = {"tcpSocket": {"port": s.ssh_port}, "periodSeconds": 2}
        pod = self._pod(self.worker(i), "worker", container, volumes, gpu_node=True)
        pod["spec"].update(hostname=self.worker(i), subdomain=self.name)
        return pod

    def objects(self, private_key: str, public_key: str) -> list[Obj]:
        """Everything but the launcher pod, in creation order: the job object first."""
        workers = [self.worker_pod(i) for i in range(self.spec.nodes)]
        return [self.job_object(), self.ssh_secret(private_key, public_key), self.service(), self.job_files(), *workers]

    def launcher_pod(self) -> Obj:
        """Runs `deepspeed --launcher pdsh` against the workers once their sshd answers; no GPU, no clockd."""
        ds = self._deepspeed(["--launcher", "pdsh", "--ssh_port", str(self.spec.ssh_port), "--no_ssh_check"])
        env = [
            {"name": "PDSH_SSH_ARGS_APPEND", "value": SSH_CLIENT_OPTS},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},  # the NVIDIA runtime gives it no GPU
        ]
        if self.spec.env:
            env.append({"name": "DS_ENV_FILE", "value": f"{JOB_DIR}/deepspeed_env"})
        mounts = [
            {"name": "ssh", "mountPath": SSH_DIR, "readOnly": True},
            {"name": "job", "mountPath": JOB_DIR, "readOnly": True},
        ]
        resources = {
            "requests": {"cpu": LAUNCHER_CPU, "memory": LAUNCHER_MEMORY},
            "limits": {"cpu": LAUNCHER_CPU, "memory": LAUNCHER_MEMORY},
        }
        args = ["launcher", "bash", "-c", f"{self._wait_for_workers()}; exec {ds}"]
        container = self._container("launcher", args, env, mounts, resources)
        return self._pod(
            self.launcher(), "launcher", container, [self._ssh_volume(), self._job_files_volume()], gpu_node=False
        )


def owned_by(obj: Obj, owner_name: str, owner_uid: str) -> Obj:
    """A copy of obj whose garbage collection follows the job object (set when the launcher creates it)."""
    out = copy.deepcopy(obj)
    out["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": owner_name,
            "uid": owner_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return out

"""The Kubernetes objects of one job, as plain dicts (printed by --dry-run, sent by the kube backend).

One ConfigMap named after the job is the job object: every other object carries an ownerReference to
it, so deleting it (or `kubectl delete cm <job>`) lets the garbage collector remove everything.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from .deepspeed_cmd import SSH_CLIENT_OPTS
from .job import DEFAULT_MASTER_PORT, JobSpec
from .kube_syntax import escape_expansion

LABEL = "envpipe.io/job"
ROLE = "envpipe.io/role"
SSH_DIR = "/etc/envpipe/ssh"
HOSTFILE_DIR = "/etc/envpipe/hostfile"
CLOCKD_DIR = "/run/envpipe"  # hostPath dir of the clockd DaemonSet; the socket is clockd.sock
Obj = dict[str, Any]


@dataclass
class KubeJob:
    spec: JobSpec
    name: str
    namespace: str
    image: str
    no_ssh: bool = False

    def worker(self, i: int) -> str:
        return f"{self.name}-worker-{i}"

    def meta(self, name: str, role: str, owner_uid: str | None) -> Obj:
        meta: Obj = {"name": name, "namespace": self.namespace, "labels": {LABEL: self.name, ROLE: role}}
        if owner_uid is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": self.name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        return meta

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
            "metadata": self.meta(self.name, "job", None),
            "data": {"job.json": json.dumps(desc)},
        }

    def ssh_secret(self, owner: str | None, private: str, public: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/ssh-auth",
            "metadata": self.meta(f"{self.name}-ssh", "ssh", owner),
            "stringData": {"ssh-privatekey": private, "ssh-publickey": public, "authorized_keys": public},
        }

    def service(self, owner: str | None) -> Obj:
        # Headless: stable DNS names <pod>.<job> for every worker, ready or not (no_ssh rendezvous).
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(self.name, "dns", owner),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {LABEL: self.name, ROLE: "worker"},
                "ports": [{"name": "ssh", "port": self.spec.ssh_port}],
            },
        }

    def hostfile_map(self, owner: str | None, text: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.meta(f"{self.name}-hostfile", "hostfile", owner),
            "data": {"hostfile": text},
        }

    def dns_hosts(self) -> list[str]:
        return [f"{self.worker(i)}.{self.name}" for i in range(self.spec.nodes)]

    def _deepspeed(self, extra: list[str], master: str) -> str:
        argv = [
            "deepspeed",
            "--hostfile",
            f"{HOSTFILE_DIR}/hostfile",
            "--master_addr",
            master,
            "--master_port",
            str(self.spec.master_port or DEFAULT_MASTER_PORT),  # a pod's network is its own: free there
            *extra,
            self.spec.script,
            *self.spec.script_args,
        ]
        return shlex.join(argv)

    def _volumes(self, hostfile: bool) -> tuple[list[Obj], list[Obj]]:
        vols: list[Obj] = [
            {"name": "ssh", "secret": {"secretName": f"{self.name}-ssh", "defaultMode": 0o400}},
            {"name": "clockd", "hostPath": {"path": CLOCKD_DIR, "type": "DirectoryOrCreate"}},
        ]
        mounts: list[Obj] = [
            {"name": "ssh", "mountPath": SSH_DIR, "readOnly": True},
            {"name": "clockd", "mountPath": CLOCKD_DIR},
        ]
        if hostfile:
            vols.append({"name": "hostfile", "configMap": {"name": f"{self.name}-hostfile"}})
            mounts.append({"name": "hostfile", "mountPath": HOSTFILE_DIR, "readOnly": True})
        return vols, mounts

    def _env(self) -> list[Obj]:
        env = [
            {"name": "ENVPIPE_CLOCKD_SOCKET", "value": f"{CLOCKD_DIR}/clockd.sock"},
            {"name": "PDSH_SSH_ARGS_APPEND", "value": f"{SSH_CLIENT_OPTS} -i {SSH_DIR}/ssh-privatekey"},
        ]
        for pair in self.spec.env:
            key, _, value = pair.partition("=")
            env.append({"name": key, "value": escape_expansion(value)})
        return env

    def worker_pod(self, i: int, owner: str | None) -> Obj:
        if self.no_ssh:  # every node runs DeepSpeed itself, torchrun-style
            cmd = self._deepspeed(["--no_ssh", f"--node_rank={i}"], self.dns_hosts()[0])
        else:
            cmd = (
                f"mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e -p {self.spec.ssh_port} "
                f"-o AuthorizedKeysFile={SSH_DIR}/authorized_keys -o StrictModes=no "
                "-o PasswordAuthentication=no"
            )
        vols, mounts = self._volumes(hostfile=self.no_ssh)
        container: Obj = {
            "name": "worker",
            "image": self.image,
            "command": ["/bin/sh", "-c", escape_expansion(cmd)],  # literal $(VAR) and $$
            "env": self._env(),
            "volumeMounts": mounts,
            "ports": [{"name": "ssh", "containerPort": self.spec.ssh_port}],
        }
        if self.spec.gpus_per_node > 0:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(self.spec.gpus_per_node)}}
        if not self.no_ssh:
            container["readinessProbe"] = {"tcpSocket": {"port": self.spec.ssh_port}, "periodSeconds": 2}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": self.meta(self.worker(i), "worker", owner),
            "spec": {
                "hostname": self.worker(i),
                "subdomain": self.name,
                "restartPolicy": "Never",
                "containers": [container],
                "volumes": vols,
            },
        }

    def launcher_pod(self, owner: str | None, master_ip: str) -> Obj:
        """Runs `deepspeed --launcher pdsh` against the workers; no GPU of its own."""
        cmd = self._deepspeed(
            ["--launcher", "pdsh", "--ssh_port", str(self.spec.ssh_port), "--no_ssh_check"], master_ip
        )
        vols, mounts = self._volumes(hostfile=True)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": self.meta(f"{self.name}-launcher", "launcher", owner),
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "launcher",
                        "image": self.image,
                        "command": ["/bin/sh", "-c", escape_expansion(cmd)],  # literal $(VAR) and $$
                        "env": [*self._env(), {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}],
                        "volumeMounts": mounts,
                    }
                ],
                "volumes": vols,
            },
        }

"""kube: worker pods + headless Service + ssh Secret, readiness by watch, hostfile from pod IPs,
DeepSpeed from a launcher pod (pdsh over ssh on 2222) or on every worker (--no_ssh); logs streamed,
exit code passed through, everything deleted through the job object's owner references."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from .. import hostfile
from ..errors import LaunchError
from ..job import JobSpec, job_name
from ..kube_manifests import LABEL, KubeJob
from ..progress import Progress

# Container states that will not fix themselves within a launch.
FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
}


@dataclass
class KubeOptions:
    image: str | None
    namespace: str = "default"
    name: str | None = None
    cpu_only: bool = False
    ready_timeout_s: float = 600.0
    keep: bool = False
    no_ssh: bool = False


def _ssh_keypair() -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "id")
        try:
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "envpipe-launch", "-f", path],
                check=True,
                capture_output=True,
            )
        except (OSError, subprocess.CalledProcessError) as e:
            raise LaunchError(f"cannot generate the job's ssh key with ssh-keygen: {e}") from e
        with open(path) as priv, open(path + ".pub") as pub:
            return priv.read(), pub.read()


def _api_error(what: str, e: ApiException) -> LaunchError:
    try:
        message = json.loads(e.body or "").get("message", e.body)
    except (TypeError, ValueError):
        message = e.body or e.reason
    return LaunchError(f"{what}: HTTP {e.status} {e.reason}: {message}")


def build_job(spec: JobSpec, opts: KubeOptions) -> KubeJob:
    if not opts.image:
        raise LaunchError("the kube backend needs --image (a worker image with sshd, python and deepspeed)")
    if spec.gpus_per_node == 0 and not opts.cpu_only:
        raise LaunchError(
            "no GPUs requested (--gpus-per-node 0) for a GPU worker image; pass --cpu for a CPU-only job"
        )
    if opts.cpu_only and spec.gpus_per_node > 0:
        raise LaunchError("--cpu conflicts with --gpus-per-node > 0")
    name = job_name(opts.name or "envpipe", "" if opts.name else secrets.token_hex(3))
    return KubeJob(spec, name, opts.namespace, opts.image, no_ssh=opts.no_ssh)


def dry_run(job: KubeJob) -> str:
    objs = [
        job.job_object(),
        job.ssh_secret("<job uid>", "<generated>", "<generated>"),
        job.service("<job uid>"),
    ]
    if job.no_ssh:
        objs.append(
            job.hostfile_map(
                "<job uid>",
                hostfile.render([hostfile.Host(h, max(job.spec.gpus_per_node, 1)) for h in job.dns_hosts()]),
            )
        )
    objs += [job.worker_pod(i, "<job uid>") for i in range(job.spec.nodes)]
    if not job.no_ssh:
        objs.append(job.hostfile_map("<job uid>", "<pod IPs, known after readiness>"))
        objs.append(job.launcher_pod("<job uid>", "<worker-0 IP>"))
    return yaml.safe_dump_all(objs, sort_keys=False)


def _load_config() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as e:
            raise LaunchError(f"no Kubernetes configuration (kubeconfig or in-cluster): {e}") from e
    return client.ApiClient()


class KubeRun:
    """One job's life on the cluster; `cleanup()` is safe to call at any point."""

    def __init__(self, job: KubeJob, api: client.CoreV1Api, timeout_s: float) -> None:
        self.job, self.api, self.timeout_s = job, api, timeout_s
        self.owner: str | None = None

    def _create(self, kind: str, body: dict[str, Any]) -> Any:
        snake = {"ConfigMap": "config_map", "Secret": "secret", "Service": "service", "Pod": "pod"}[kind]
        create = getattr(self.api, f"create_namespaced_{snake}")
        try:
            return create(self.job.namespace, body)
        except ApiException as e:
            raise _api_error(f"creating {kind} {body['metadata']['name']}", e) from e

    def create_workers(self) -> None:
        job = self.job
        self.owner = self._create("ConfigMap", job.job_object()).metadata.uid
        private, public = _ssh_keypair()
        self._create("Secret", job.ssh_secret(self.owner, private, public))
        self._create("Service", job.service(self.owner))
        if job.no_ssh:
            hosts = [hostfile.Host(h, max(job.spec.gpus_per_node, 1)) for h in job.dns_hosts()]
            self._create("ConfigMap", job.hostfile_map(self.owner, hostfile.render(hosts)))
        for i in range(job.spec.nodes):
            self._create("Pod", job.worker_pod(i, self.owner))

    def _selector(self, role: str) -> str:
        return f"{LABEL}={self.job.name},envpipe.io/role={role}"

    def wait_workers(self) -> list[str]:
        """Watch (not poll) until every worker is Ready with an IP; fail fast on fatal pod states."""
        want = self.job.spec.nodes
        ready: dict[str, str] = {}
        bar = Progress("workers ready", want)

        def seen(pod: Any) -> bool:
            # with --no-ssh a worker may finish its (short) job before the last one starts
            _check_pod(pod, fatal_phases=("Failed",) if self.job.no_ssh else ("Failed", "Succeeded"))
            if _is_ready(pod, need_probe=not self.job.no_ssh):
                ready[pod.metadata.name] = pod.status.pod_ip
            else:
                ready.pop(pod.metadata.name, None)
            bar.update(len(ready))
            return len(ready) == want

        listing = self.api.list_namespaced_pod(self.job.namespace, label_selector=self._selector("worker"))
        done = False
        for pod in listing.items:
            done = seen(pod)
        version = listing.metadata.resource_version if listing.metadata else None
        deadline = time.monotonic() + self.timeout_s
        w = watch.Watch()
        try:
            while not done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LaunchError(
                        f"timed out after {self.timeout_s:g}s: {len(ready)}/{want} workers ready"
                    )
                for event in w.stream(
                    self.api.list_namespaced_pod,
                    self.job.namespace,
                    label_selector=self._selector("worker"),
                    resource_version=version,
                    timeout_seconds=max(1, int(left)),
                ):
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    if event["type"] == "DELETED":
                        raise LaunchError(f"worker pod {pod.metadata.name} was deleted")
                    if seen(pod):
                        done = True
                        break
        finally:
            w.stop()
        bar.done()
        return [ready[self.job.worker(i)] for i in range(want)]

    def start_launcher(self, ips: list[str]) -> str:
        hosts = [hostfile.Host(ip, max(self.job.spec.gpus_per_node, 1)) for ip in ips]
        text = hostfile.render(hosts)
        print(f"envpipe-launch: hostfile\n{text}", file=sys.stderr, end="")
        self._create("ConfigMap", self.job.hostfile_map(self.owner, text))
        self._create("Pod", self.job.launcher_pod(self.owner, ips[0]))
        return f"{self.job.name}-launcher"

    def follow(self, pods: list[str]) -> int:
        """Stream the first pod's log, then wait (watch) for all to end; the first non-zero code wins."""
        self._wait_started(pods[0])
        try:
            resp: Any = self.api.read_namespaced_pod_log(
                pods[0], self.job.namespace, follow=True, _preload_content=False
            )
            for chunk in resp.stream(4096):
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        except ApiException as e:
            raise _api_error(f"streaming logs of {pods[0]}", e) from e
        codes = [self._exit_code(p) for p in pods]
        return next((c for c in codes if c != 0), 0)

    def _watch_pod(self, name: str, done: Any) -> Any:
        w = watch.Watch()
        try:
            for event in w.stream(
                self.api.list_namespaced_pod,
                self.job.namespace,
                field_selector=f"metadata.name={name}",
                timeout_seconds=int(self.timeout_s),
            ):
                pod = event["object"]
                if event["type"] == "DELETED":
                    raise LaunchError(f"pod {name} was deleted")
                _check_pod(pod, fatal_phases=())  # here Failed is a result, not a launch error
                if done(pod):
                    return pod
        finally:
            w.stop()
        raise LaunchError(f"timed out waiting for pod {name}")

    def _wait_started(self, name: str) -> None:
        self._watch_pod(
            name, lambda p: p.status is not None and p.status.phase in ("Running", "Succeeded", "Failed")
        )

    def _exit_code(self, name: str) -> int:
        pod = self._watch_pod(
            name, lambda p: p.status is not None and p.status.phase in ("Succeeded", "Failed")
        )
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.terminated:
                return int(cs.state.terminated.exit_code)
        return 0 if pod.status.phase == "Succeeded" else 1

    def cleanup(self) -> None:
        """Deleting the job object is enough: the owner references hand the rest to the GC."""
        if self.owner is None:
            return
        try:
            self.api.delete_namespaced_config_map(
                self.job.name,
                self.job.namespace,
                body=client.V1DeleteOptions(propagation_policy="Foreground"),
            )
        except ApiException as e:
            if e.status != 404:
                print(f"envpipe-launch: cleanup of job {self.job.name} failed: {e.reason}", file=sys.stderr)


def _check_pod(pod: Any, fatal_phases: tuple[str, ...]) -> None:
    """Raise on pod states that will not fix themselves within a launch."""
    st, name = pod.status, pod.metadata.name
    if st is None:
        return
    if st.phase in fatal_phases:
        raise LaunchError(f"pod {name} ended early ({st.phase}): {st.message or ''}")
    for cs in st.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in FATAL_WAITING:
            raise LaunchError(f"pod {name}: {waiting.reason}: {waiting.message or ''}")


def _is_ready(pod: Any, need_probe: bool) -> bool:
    st = pod.status
    if st is None or not st.pod_ip:
        return False
    if not need_probe:  # --no-ssh: started is enough
        return bool(st.phase in ("Running", "Succeeded"))
    if st.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in st.conditions or [])


def launch(
    spec: JobSpec, opts: KubeOptions, dry_run_only: bool = False, api_client: client.ApiClient | None = None
) -> int:
    job = build_job(spec, opts)
    if dry_run_only:
        sys.stdout.write(dry_run(job))
        return 0
    run = KubeRun(job, client.CoreV1Api(api_client or _load_config()), opts.ready_timeout_s)
    print(f"envpipe-launch: job {job.name} in namespace {job.namespace}", file=sys.stderr)
    try:
        run.create_workers()
        ips = run.wait_workers()
        pods = [job.worker(i) for i in range(spec.nodes)] if job.no_ssh else [run.start_launcher(ips)]
        return run.follow(pods)
    except KeyboardInterrupt:
        print("envpipe-launch: interrupted", file=sys.stderr)
        return 130
    finally:
        if opts.keep:
            print(
                f"envpipe-launch: kept job {job.name} (delete everything with: kubectl delete configmap "
                f"{job.name} -n {job.namespace})",
                file=sys.stderr,
            )
        else:
            run.cleanup()

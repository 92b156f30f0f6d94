"""kube: worker pods + headless Service + ssh Secret + hostfile of the workers' DNS names, readiness by
watch, DeepSpeed from a launcher pod (pdsh over ssh on 2222) or on every worker (--no_ssh); logs
streamed, exit code passed through, everything deleted through the job object's owner references."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from ..errors import LaunchError
from ..job import JobSpec, job_name
from ..kube_manifests import LABEL, KubeJob, PodSettings, owned_by
from ..pod_contract import ClockdSocket
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
    pods: PodSettings = field(default_factory=PodSettings)


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_LABEL_KEY = re.compile(rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_AFFINITY_KINDS = {"nodeAffinity", "podAffinity", "podAntiAffinity"}


def _label(pair: str, what: str) -> tuple[str, str]:
    key, sep, value = pair.partition("=")
    if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
        raise LaunchError(f"{what} expects KEY=VALUE with a Kubernetes label key and value, got {pair!r}")
    return key, value


def _toleration(text: str) -> dict[str, str]:
    """kubectl's taint syntax: KEY[=VALUE][:EFFECT]; without a value any value of KEY is tolerated."""
    rest, _, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, sep, value = rest.partition("=")
    if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or (effect and effect not in _TAINT_EFFECTS):
        raise LaunchError(
            f"--toleration expects KEY[=VALUE][:EFFECT] with EFFECT one of {', '.join(_TAINT_EFFECTS)}, got {text!r}"
        )
    tol = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        tol["value"] = value
    if effect:
        tol["effect"] = effect
    return tol


def _affinity(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise LaunchError(f"cannot read --affinity {path}: {e}") from e
    if not isinstance(data, dict) or not data or not set(data) <= _AFFINITY_KINDS:
        raise LaunchError(f"--affinity {path} must hold a mapping of {', '.join(sorted(_AFFINITY_KINDS))}")
    return data


def pod_settings(
    cpu: int = 4,
    memory_gib: int = 16,
    shm_gib: int = 4,
    node_selector: tuple[str, ...] = (),
    tolerations: tuple[str, ...] = (),
    affinity_file: str | None = None,
    image_pull_secrets: tuple[str, ...] = (),
    priority_class: str | None = None,
    clockd_dir: str | None = None,
    clockd_gid: int | None = None,
    no_clockd: bool = False,
) -> PodSettings:
    """The kube options of the CLI, checked: one clear line for each kind of mistake."""
    for flag, value in (("--worker-cpu", cpu), ("--worker-memory", memory_gib), ("--shm-size", shm_gib)):
        if value < 1:
            raise LaunchError(f"{flag} must be >= 1, got {value}")
    for flag, name in [("--image-pull-secret", s) for s in image_pull_secrets] + [
        ("--priority-class", priority_class or "x")
    ]:
        if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            raise LaunchError(f"{flag} {name!r} is not a Kubernetes object name (lowercase a-z, 0-9, '-', '.')")
    clockd: ClockdSocket | None = ClockdSocket()
    if no_clockd:
        if clockd_dir is not None or clockd_gid is not None:
            raise LaunchError("--no-clockd conflicts with --clockd-dir and --clockd-gid")
        clockd = None
    else:
        default = ClockdSocket()
        host_dir = default.host_dir if clockd_dir is None else clockd_dir.rstrip("/")
        gid = default.gid if clockd_gid is None else clockd_gid
        if not host_dir.startswith("/") or any(c.isspace() for c in host_dir):
            raise LaunchError(f"--clockd-dir must be an absolute path without spaces, got {clockd_dir!r}")
        if not 1 <= gid < 2**31:
            raise LaunchError(f"--clockd-gid must lie in 1..2147483647, got {gid}")
        clockd = ClockdSocket(host_dir=host_dir, gid=gid)
    return PodSettings(
        cpu=str(cpu),
        memory_gib=memory_gib,
        shm_gib=shm_gib,
        node_selector=dict(_label(p, "--node-selector") for p in node_selector),
        tolerations=tuple(_toleration(t) for t in tolerations),
        affinity=_affinity(affinity_file) if affinity_file else None,
        image_pull_secrets=image_pull_secrets,
        priority_class=priority_class,
        clockd=clockd,
    )


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
        raise LaunchError("no GPUs requested (--gpus-per-node 0) for a GPU worker image; pass --cpu for a CPU-only job")
    if opts.cpu_only and spec.gpus_per_node > 0:
        raise LaunchError("--cpu conflicts with --gpus-per-node > 0")
    if opts.pods.shm_gib >= opts.pods.memory_gib:
        raise LaunchError(
            f"--shm-size {opts.pods.shm_gib} GiB must be below --worker-memory {opts.pods.memory_gib} GiB "
            "(a memory-backed /dev/shm counts against the pod's memory limit)"
        )
    name = job_name(opts.name or "envpipe", "" if opts.name else secrets.token_hex(3))
    return KubeJob(
        spec,
        name,
        opts.namespace,
        opts.image,
        no_ssh=opts.no_ssh,
        pods=opts.pods,
        worker_wait_s=int(opts.ready_timeout_s),
    )


class _ManifestDumper(yaml.SafeDumper):
    """Quotes y/n too: YAML 1.1 parsers (Go's, in kubectl) read them as booleans, PyYAML does not."""


_ManifestDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^[yYnN]$"), list("yYnN"))


def dry_run(job: KubeJob) -> str:
    """The objects as the launcher would create them, with a fresh ssh key and without the owner
    references (they need the job object's uid): `kubectl apply -f` starts the same job."""
    objs = job.objects(*_ssh_keypair())
    if not job.no_ssh:
        objs.append(job.launcher_pod())
    return yaml.dump_all(objs, Dumper=_ManifestDumper, sort_keys=False)


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

    def _create_owned(self, body: dict[str, Any]) -> Any:
        assert self.owner is not None
        return self._create(body["kind"], owned_by(body, self.job.name, self.owner))

    def create_workers(self) -> None:
        job_object, *rest = self.job.objects(*_ssh_keypair())
        self.owner = self._create("ConfigMap", job_object).metadata.uid
        for body in rest:
            self._create_owned(body)

    def _selector(self, role: str) -> str:
        return f"{LABEL}={self.job.name},envpipe.io/role={role}"

    def wait_workers(self) -> list[str]:
        """Watch (not poll) until every worker is Ready with an IP; fail fast on fatal pod states.
        Returns the workers' IPs, in order."""
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
                    raise LaunchError(f"timed out after {self.timeout_s:g}s: {len(ready)}/{want} workers ready")
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

    def start_launcher(self) -> str:
        self._create_owned(self.job.launcher_pod())
        return self.job.launcher()

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
        self._watch_pod(name, lambda p: p.status is not None and p.status.phase in ("Running", "Succeeded", "Failed"))

    def _exit_code(self, name: str) -> int:
        pod = self._watch_pod(name, lambda p: p.status is not None and p.status.phase in ("Succeeded", "Failed"))
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
        print(f"envpipe-launch: hostfile\n{job.hostfile()}", file=sys.stderr, end="")
        run.create_workers()
        ips = run.wait_workers()
        print(f"envpipe-launch: workers ready at {', '.join(ips)}", file=sys.stderr)
        pods = [job.worker(i) for i in range(spec.nodes)] if job.no_ssh else [run.start_launcher()]
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

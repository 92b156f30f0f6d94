"""One kube job's life on the cluster: create, admit, wait for the nodes, follow, clean up.

The workload (Job or JobSet) is created suspended, so that no pod starts before the Secret and
ConfigMap it mounts exist; those are then created with an owner reference to it. Without a queue the
launcher unsuspends it; with one, Kueue does once it admits the job, and the launcher waits for that.
Readiness and the end are followed by watch (one list, then a stream from its resourceVersion), never
by polling. Deleting the workload (foreground) lets the garbage collector remove everything else.

Creation is undoable: each object is recorded before the launcher asks for it, so that whenever a signal
comes (an answer that never arrived included), `cleanup` deletes what may exist of it, by name, if it
carries this launch's label (a name taken by someone else's object is left alone), and then checks that
it is gone or going; what it cannot confirm is one line with the command that deletes it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from .. import kube_version
from ..errors import LaunchError, Stopped, handling
from ..kube_manifests import CONTAINER, INDEX_ANNOTATION, JOBSET, LABEL, LAUNCH, REPLICATED_JOB, ROLE, KubeJob
from ..progress import Progress
from ..sshkeys import KeyPair

# Container states that will not fix themselves within a launch.
FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
}
WATCH_CHUNK_S = 300  # an open-ended wait renews its watch this often
CLEANUP_REQUEST_S = 30  # each request of the cleanup: an API server that does not answer is not waited for
Obj = dict[str, Any]
_CORE = {"ConfigMap": "config_map", "Secret": "secret", "Service": "service"}  # CoreV1Api's method names


def api_error(what: str, e: ApiException) -> LaunchError:
    try:
        message = json.loads(e.body or "").get("message", e.body)
    except (TypeError, ValueError, AttributeError):
        message = e.body or e.reason
    return LaunchError(f"{what}: HTTP {e.status} {e.reason}: {message}")


def server_version(api: client.ApiClient) -> kube_version.KubeVersion:
    """The cluster's Kubernetes version (GET /version); one line where it is not supported or not reachable."""
    try:
        info = client.VersionApi(api).get_code()
    except ApiException as e:
        raise api_error("asking the API server its version", e) from e
    except HTTPError as e:  # connection refused, TLS, DNS: the first call to the cluster is where it shows
        raise LaunchError(f"cannot reach the Kubernetes API server at {api.configuration.host}: {e}") from e
    return kube_version.supported(kube_version.parse(info.major, info.minor, info.git_version))


SSH_SECRET_KEYS = ("ssh-privatekey", "authorized_keys")  # what the pods mount of an --ssh-secret


class PodGone(LaunchError):
    """A pod was deleted (by its Job's controller once the Job failed, or by someone)."""


@contextlib.contextmanager
def _watching(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Iterator[dict[str, Any]]]:
    """A watch's events; the stream's connection is closed on leaving, even by an exception (whose
    traceback would otherwise keep it open)."""
    w = watch.Watch()
    events = w.stream(func, *args, **kwargs)
    try:
        yield events
    finally:
        w.stop()
        events.close()


def _say(line: str) -> None:
    print(f"envpipe-launch: {line}", file=sys.stderr, flush=True)


class KubeRun:
    """One job's life on the cluster; `cleanup()` is safe to call at any point."""

    def __init__(self, job: KubeJob, api: client.ApiClient, timeout_s: float) -> None:
        self.job, self.timeout_s = job, timeout_s
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.owner: str | None = None  # the workload's uid, once it exists
        self.asked: list[tuple[str, str]] = []  # (kind, name) of every object asked for, before asking
        self.created = False  # every object exists: from now on the job is whole (and --keep may keep it)
        self.pods: dict[int, str] = {}  # node index -> pod name

    # ---- the workload ----
    def _kind_args(self) -> tuple[str, str, str, str]:
        k = self.job.kind
        return k.group, k.version, self.job.namespace, k.plural

    def create(self, keys: KeyPair | None) -> None:
        """The workload (suspended), then what it owns (the job's own ssh Secret with ``keys`` among it, where
        given); each recorded in `asked` before it is asked for."""
        kind = self.job.kind
        self.asked.append((kind.kind, self.job.name))
        try:
            created: Obj = self.custom.create_namespaced_custom_object(  # type: ignore[assignment]  # a dict
                *self._kind_args(), self.job.workload(suspend=True)
            )
        except ApiException as e:
            if e.status == 409:  # someone else's: not ours to delete
                self.asked.pop()
            if e.status == 404 and kind is JOBSET and "could not find the requested resource" in (e.body or ""):
                raise LaunchError(
                    f"the cluster has no JobSet API ({JOBSET.api_version}): install JobSet, or use --workload job"
                ) from e
            raise api_error(f"creating {kind.kind} {self.job.name}", e) from e
        self.owner = created["metadata"]["uid"]
        for body in self.job.dependents(keys):
            self._create_core(self.job.owned_by(body, self.owner))
        self.created = True

    def check_ssh_secret(self) -> None:
        """The user's ssh Secret (--ssh-secret) exists and holds what the pods mount: one line otherwise, before
        anything is created."""
        name, ns = self.job.secret_name, self.job.namespace
        try:
            secret = self.core.read_namespaced_secret(name, ns)
        except ApiException as e:
            if e.status == 404:
                raise LaunchError(f"--ssh-secret {name}: no Secret {name} in namespace {ns} (docs/launcher.md says "
                                  "how to make one)") from e
            raise api_error(f"reading Secret {name}", e) from e
        missing = [k for k in SSH_SECRET_KEYS if k not in (secret.data or {})]
        if missing:
            raise LaunchError(f"--ssh-secret {name}: the Secret has no {' and no '.join(missing)} (the pods mount "
                              f"{' and '.join(SSH_SECRET_KEYS)})")

    def _create_core(self, body: Obj) -> None:
        kind, name = body["kind"], body["metadata"]["name"]
        self.asked.append((kind, name))
        try:
            getattr(self.core, f"create_namespaced_{_CORE[kind]}")(self.job.namespace, body)
        except ApiException as e:
            if e.status == 409:
                self.asked.pop()
            raise api_error(f"creating {kind} {name}", e) from e

    def start(self) -> None:
        """Without a queue, unsuspend; with one, wait (as long as it takes) for Kueue to admit the job."""
        queue = self.job.batch.queue
        if queue is None:
            try:
                unsuspend = {"spec": {"suspend": False}}
                self.custom.patch_namespaced_custom_object(*self._kind_args(), self.job.name, unsuspend)
            except ApiException as e:
                raise api_error(f"starting {self.job.kind.kind} {self.job.name}", e) from e
            return
        _say(f"queued in Kueue LocalQueue {queue}: waiting to be admitted (Ctrl-C cancels the job)")
        t0 = time.monotonic()
        self._watch_workload(lambda w: not w.get("spec", {}).get("suspend"), "admission")
        _say(f"admitted by Kueue after {time.monotonic() - t0:.0f}s")

    def _watch_workload(self, done: Callable[[Obj], bool], what: str) -> Obj:
        """Watch the workload until done(it); it failing or disappearing ends the wait too."""
        while True:
            with _watching(self.custom.list_namespaced_custom_object, *self._kind_args(),
                           field_selector=f"metadata.name={self.job.name}", timeout_seconds=WATCH_CHUNK_S) as events:
                for event in events:
                    obj = event["object"]
                    if event["type"] == "DELETED":
                        raise LaunchError(f"{self.job.kind.kind} {self.job.name} was deleted while waiting for {what}")
                    if done(obj):
                        return obj
                    failure = _condition(obj, "Failed")
                    if failure is not None:
                        raise LaunchError(f"{self.job.kind.kind} {self.job.name} failed: {self._why_failed(obj)}")

    def failure(self) -> str | None:
        """Why the workload fails, if it does (for messages about its pods): its Failed condition, or
        FailureTarget, which the Job controller sets before it deletes the pods."""
        try:
            obj: Obj = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]  # a dict
                *self._kind_args(), self.job.name)
        except ApiException:
            return None
        cond = _condition(obj, "Failed") or _condition(obj, "FailureTarget")
        return _describe(cond) if cond else None

    def warning(self) -> str | None:
        """The last Warning event of the workload or its Jobs (a pod the Job controller could not create:
        quota, admission), for a message about nodes that never came."""
        try:
            events = self.core.list_namespaced_event(self.job.namespace, field_selector="type=Warning").items
        except ApiException:
            return None
        names = {self.job.name, f"{self.job.name}-{REPLICATED_JOB}-0"}  # the workload, a JobSet's Job
        ours = [e for e in events if e.involved_object.kind in ("Job", "JobSet") and e.involved_object.name in names]
        if not ours:
            return None
        last = max(ours, key=lambda e: e.last_timestamp.timestamp() if e.last_timestamp else 0.0)
        return f"{last.involved_object.kind} {last.involved_object.name}: {last.reason}: {last.message}"

    # ---- the nodes ----
    def _selector(self) -> str:
        return f"{LABEL}={self.job.name},{ROLE}=node"

    def wait_nodes(self) -> list[str]:
        """Watch (not poll) until every node's pod is Ready with an IP; fail fast on fatal pod states.
        Returns the nodes' IPs by index."""
        want = self.job.spec.nodes
        ready: dict[int, str] = {}
        bar = Progress("nodes ready", want)

        def seen(pod: Any) -> bool:
            index = _index(pod)
            if index is None:
                return len(ready) == want
            self.pods[index] = pod.metadata.name
            # with --no-ssh a node may finish its (short) job before the last one starts
            _check_pod(pod, fatal_phases=("Failed",) if self.job.no_ssh else ("Failed", "Succeeded"))
            if _is_ready(pod, need_probe=not self.job.no_ssh):
                ready[index] = pod.status.pod_ip
            else:
                ready.pop(index, None)
            bar.update(len(ready))
            return len(ready) == want

        listing = self.core.list_namespaced_pod(self.job.namespace, label_selector=self._selector())
        done = False
        for pod in listing.items:
            done = seen(pod)
        version = listing.metadata.resource_version if listing.metadata else None
        deadline = time.monotonic() + self.timeout_s
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                why = self.warning()
                raise LaunchError(f"timed out after {self.timeout_s:g}s: {len(ready)}/{want} nodes ready"
                                  + (f" (last warning: {why})" if why else ""))
            with _watching(self.core.list_namespaced_pod, self.job.namespace, label_selector=self._selector(),
                           resource_version=version, timeout_seconds=max(1, int(left))) as events:
                for event in events:
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    if event["type"] == "DELETED":
                        why = self.failure()
                        raise LaunchError(f"node pod {pod.metadata.name} was deleted" + (f" ({why})" if why else ""))
                    if seen(pod):
                        done = True
                        break
        bar.done()
        return [ready[i] for i in range(want)]

    # ---- the end ----
    def follow(self) -> int:
        """Stream node 0's log (the launcher, or rank 0's node with --no-ssh), wait for the workload to
        finish, and return the job's exit status."""
        first = self.pods[0]
        try:
            self._wait_started(first)
            self._stream_log(first)
        except PodGone:
            pass  # deleted by the Job's controller: the workload's end below says why
        kind = self.job.kind
        finished = self._watch_workload(
            lambda w: any(_condition(w, t) for t in (kind.succeeded, "Failed")), "the job to finish")
        if _condition(finished, kind.succeeded):
            return 0
        _say(f"job {self.job.name} failed: {self._why_failed(finished)}")
        return self._first_failed_exit_code() or 1

    def _why_failed(self, workload: Obj) -> str:
        """The workload's Failed condition; for a JobSet also its failed Job's (which names the pod)."""
        text = _describe(_condition(workload, "Failed") or {})
        if self.job.kind is JOBSET:
            child = f"{self.job.name}-{REPLICATED_JOB}-0"
            try:
                job: Obj = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]  # a dict
                    "batch", "v1", self.job.namespace, "jobs", child)
            except ApiException:
                return text
            cond = _condition(job, "Failed")
            if cond is not None:
                text += f"; Job {child}: {_describe(cond)}"
        return text

    def _first_failed_exit_code(self) -> int | None:
        """The exit code of the pod that failed first (its container's finishedAt; node 0 first on a tie)."""
        pods = self.core.list_namespaced_pod(self.job.namespace, label_selector=self._selector()).items
        failed = []
        for pod in pods:
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                term = cs.state.terminated if cs.state else None
                if cs.name == CONTAINER and term is not None and term.exit_code:
                    when = term.finished_at.timestamp() if term.finished_at else float("inf")
                    failed.append((when, _index(pod) or 0, int(term.exit_code)))
        return min(failed)[2] if failed else None

    def _stream_log(self, name: str) -> None:
        try:
            resp: Any = self.core.read_namespaced_pod_log(name, self.job.namespace, follow=True,
                                                          _preload_content=False)
            for chunk in resp.stream(4096):
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        except ApiException as e:
            if e.status == 404:
                raise PodGone(f"pod {name} was deleted") from e
            raise api_error(f"streaming logs of {name}", e) from e

    def _watch_pod(self, name: str, done: Callable[[Any], bool]) -> Any:
        """List, then watch from the list's resourceVersion: a pod deleted before the watch began is
        seen as gone, not waited for."""
        selector = f"metadata.name={name}"
        listing = self.core.list_namespaced_pod(self.job.namespace, field_selector=selector)
        if not listing.items:
            raise PodGone(f"pod {name} was deleted")
        pod = listing.items[0]
        _check_pod(pod, fatal_phases=())  # here Failed is a result, not a launch error
        if done(pod):
            return pod
        with _watching(self.core.list_namespaced_pod, self.job.namespace, field_selector=selector,
                       resource_version=listing.metadata.resource_version if listing.metadata else None,
                       timeout_seconds=int(self.timeout_s)) as events:
            for event in events:
                pod = event["object"]
                if event["type"] == "DELETED":
                    raise PodGone(f"pod {name} was deleted")
                _check_pod(pod, fatal_phases=())
                if done(pod):
                    return pod
        raise LaunchError(f"timed out waiting for pod {name}")

    def _wait_started(self, name: str) -> None:
        self._watch_pod(name, lambda p: p.status is not None and p.status.phase in ("Running", "Succeeded", "Failed"))

    def cleanup(self) -> None:
        """Delete what may exist of what was asked for: the workload first (foreground: the garbage collector
        removes its pods and what it owns), then any of the rest still there (created after its owner's
        deletion began); then check that each is gone or being deleted. Safe to call at any point; a second
        SIGINT or SIGTERM meanwhile waits for its end (signals are held, then the CLI reports the first)."""
        held: list[int] = []
        with handling(lambda signum, _frame: held.append(signum)):
            for kind, name in self.asked:
                self._delete_if_ours(kind, name)
            left = [(kind, name) for kind, name in self.asked if not self._gone_or_going(kind, name)]
        if left:
            ns = self.job.namespace
            _say(f"could not confirm the deletion of {', '.join(f'{k} {n}' for k, n in left)} in namespace {ns}: "
                 f"kubectl delete {' '.join(f'{k.lower()}/{n}' for k, n in left)} -n {ns}")
        if held:
            raise Stopped(held[0])

    def _read(self, kind: str, name: str) -> Obj | None:
        """The object as the API server has it now (None: there is none)."""
        api, ns = self.job.kind, self.job.namespace
        try:
            if kind in _CORE:
                read = getattr(self.core, f"read_namespaced_{_CORE[kind]}")
                found = read(name, ns, _request_timeout=CLEANUP_REQUEST_S)
                return self.core.api_client.sanitize_for_serialization(found)  # type: ignore[no-any-return]
            return self.custom.get_namespaced_custom_object(  # type: ignore[return-value]  # a dict
                api.group, api.version, ns, api.plural, name, _request_timeout=CLEANUP_REQUEST_S)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _delete_if_ours(self, kind: str, name: str) -> None:
        try:
            obj = self._read(kind, name)
            meta = (obj or {}).get("metadata") or {}
            if obj is None or (meta.get("labels") or {}).get(LAUNCH) != self.job.launch or meta.get(
                    "deletionTimestamp"):
                return
            body = client.V1DeleteOptions(propagation_policy="Foreground",
                                          preconditions=client.V1Preconditions(uid=meta.get("uid")))
            api, ns = self.job.kind, self.job.namespace
            if kind in _CORE:
                getattr(self.core, f"delete_namespaced_{_CORE[kind]}")(name, ns, body=body,
                                                                       _request_timeout=CLEANUP_REQUEST_S)
            else:
                self.custom.delete_namespaced_custom_object(api.group, api.version, ns, api.plural, name, body=body,
                                                            _request_timeout=CLEANUP_REQUEST_S)
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as e:
            if getattr(e, "status", None) not in (404, 409):  # gone, or replaced by another object meanwhile
                _say(f"cleanup of {kind} {name} failed: {getattr(e, 'reason', None) or e}")

    def _gone_or_going(self, kind: str, name: str) -> bool:
        """Deleted, being deleted (foreground: until its dependents are), or not this launch's."""
        try:
            obj = self._read(kind, name)
        except (ApiException, OSError, urllib3.exceptions.HTTPError):
            return False
        meta = (obj or {}).get("metadata") or {}
        return obj is None or bool(meta.get("deletionTimestamp")) or (meta.get("labels") or {}).get(
            LAUNCH) != self.job.launch


def _condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _describe(cond: Obj) -> str:
    return ": ".join(p for p in (cond.get("reason"), cond.get("message")) if p) or "no reason given"


def _index(pod: Any) -> int | None:
    value = (pod.metadata.annotations or {}).get(INDEX_ANNOTATION)
    return int(value) if value is not None and value.isdigit() else None


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

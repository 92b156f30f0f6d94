"""A small fake Kubernetes API server over real HTTP (aiohttp), with the controllers and the kubelet
that envpipe-launch's jobs meet.

The API: create (201; 409 on an existing name; 422 when the object fails its schema, see
tests/support/schemas; 403 on a pod quota; `on_create` is called while the request is in flight), get
(404), merge-patch, list/watch with labelSelector, fieldSelector and resourceVersion (JSON-lines watch
stream), delete with propagationPolicy and a uid precondition (409 when it differs; the garbage collector
follows ownerReferences), pod logs with follow=true, the discovery documents (/api, /api/v1, /apis,
/apis/<group>/<version>) that kubectl reads first, and /version, answered as a Kubernetes of `version`
("1.33") answers it. Objects are checked against that version's schemas; below 1.31 a Job's `successPolicy`
(and a JobSet's Job template's) is dropped on create, as the API server drops a field it does not serve
(unknown before 1.30, an alpha gate in 1.30; with a warning, the clients' default field validation). Kinds:
Pod, Service,
Secret, ConfigMap, Event (core/v1), Job (batch/v1) and, unless `jobset=False` (a cluster without
the CRD: 404 as there), JobSet (jobset.x-k8s.io/v1alpha2).

The controllers (kube_controllers.py): Job, JobSet, their TTL-after-finished, and Kueue for the
LocalQueues in `queues` (name -> admission delay in seconds). They run from one work queue, like the
real ones, on every change of the objects they own.

The kubelet moves pods Pending -> Running (pod IP, Ready) or into ErrImagePull for images containing
"does-not-exist", and runs the runtime image's entrypoint modes: `worker` serves (sshd) until the pod
is deleted; `node` serves on every index but 0, where it runs, and a serving node told where node 0 is
(ENVPIPE_LAUNCHER_NODE) exits 0 once node 0's pod has ended or is gone; anything else runs. Running means: the
log is the command plus the files of mounted ConfigMaps, then after `run_s` the container exits with
`exit_codes[index]` or else `job_exit_code`. `disrupt(ns, pod)` plays a node drain (the pod fails
with condition DisruptionTarget).

It is not a real API server: no admission beyond schemas, quota and the Kueue webhook, no RBAC, no
scheduling, no finalizers.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import itertools
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from envpipe_launch.pod_contract import LAUNCHER_NODE_ENV

from tests.support import schemas
from tests.support.fakes.kube_controllers import (
    INDEX_KEY,
    TERMINAL,
    FakeKueue,
    JobController,
    JobSetController,
    default_job,
    default_jobset,
    now,
)
from tests.support.fakes.kubelet import kubelet_expand

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group_version: str  # "v1" for the core group

    @property
    def path(self) -> str:
        return "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"


RESOURCES = [
    Resource("pods", "Pod", "v1"),
    Resource("services", "Service", "v1"),
    Resource("secrets", "Secret", "v1"),
    Resource("configmaps", "ConfigMap", "v1"),
    Resource("events", "Event", "v1"),
    Resource("jobs", "Job", "batch/v1"),
    Resource("jobsets", "JobSet", "jobset.x-k8s.io/v1alpha2"),
]
K8S_VERSION = schemas.K8S_VERSION


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}
    return web.json_response(body, status=code)


def _field(obj: Obj, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return obj


def _matches(obj: Obj, labels: str | None, fields: str | None) -> bool:
    have = obj["metadata"].get("labels") or {}
    for term in filter(None, (labels or "").split(",")):
        k, _, v = term.partition("=")
        if have.get(k) != v:
            return False
    for term in filter(None, (fields or "").split(",")):
        k, _, v = term.partition("=")
        if str(_field(obj, k)) != v:
            return False
    return True


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


class FakeKubeAPI:
    def __init__(
        self,
        pod_quota: int | None = None,
        job_exit_code: int = 0,
        start_delay_s: float = 0.02,
        validate: bool = True,
        run_s: float | None = None,
        jobset: bool = True,
        queues: dict[str, float] | None = None,
        version: str = schemas.K8S_VERSION,
    ) -> None:
        self.pod_quota, self.job_exit_code, self.start_delay_s = pod_quota, job_exit_code, start_delay_s
        self.exit_codes: dict[int, int] = {}  # by completion index, over job_exit_code
        self.validate = validate
        self.version = version  # "major.minor", as /version answers and the schemas are chosen
        self.run_s = run_s  # how long a running container runs; default start_delay_s
        self.resources = {r.plural: r for r in RESOURCES if jobset or r.plural != "jobsets"}
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.events: list[tuple[int, str, str, Obj]] = []  # (rv, plural, type, object)
        self.logs: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        self.requests: collections.Counter[str] = collections.Counter()
        self.rejected: list[str] = []  # validation messages of 422 answers and refused controller creates
        # called in a create request (plural, body, "received" or "stored": before or after the object exists,
        # the answer not sent yet), e.g. to signal the client while its request is in flight
        self.on_create: Callable[[str, Obj, str], None] | None = None
        self.jobs, self.jobsets = JobController(self), JobSetController(self)
        self.kueue = FakeKueue(self, queues or {})
        self._rv = itertools.count(1)
        self._ips = itertools.count(2)
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task] = set()  # kubelets, timers, the work queue: cancelled at stop
        self._work: asyncio.Queue[tuple[str, str, str]] | None = None
        self._pending: set[tuple[str, str, str]] = set()
        self._expiring: set[str] = set()  # uids with a TTL timer
        self.port = 0

    # ---- lifecycle (a thread with its own event loop, so sync tests can use it) ----
    def start(self) -> FakeKubeAPI:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._changed = asyncio.Condition()
        self._work = asyncio.Queue()
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._log)
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}", self._collection)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}", self._item)
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)  # the Python client asks with the slash
        app.router.add_get("/api", self._api_versions)
        app.router.add_get("/apis", self._api_groups)
        app.router.add_get("/api/{version}", self._api_resources)
        app.router.add_get("/apis/{group}/{version}", self._api_resources)
        self._runner = web.AppRunner(app, shutdown_timeout=1)  # watches still open end at stop
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._spawn(self._controllers())
        ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        assert self._runner is not None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._runner.cleanup()

    def call(self, coro: Awaitable[Any]) -> Any:
        """Run `coro` on the server's loop from a test's thread (e.g. `api.call(api.disrupt(...))`)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        """The real `kubernetes` client's ApiClient pointed at this server."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file for this server (namespace default), as kubectl and the launcher read it."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": "x"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": "default"}}],
        }))
        return path

    def names(self, plural: str) -> list[str]:
        return sorted(n for (p, _, n) in list(self.objects) if p == plural)

    # ---- storage, as the controllers use it ----
    def get(self, plural: str, ns: str, name: str) -> Obj | None:
        return self.objects.get((plural, ns, name))

    def items(self, plural: str, ns: str) -> Iterator[Obj]:
        return (o for (p, n, _), o in list(self.objects.items()) if p == plural and n == ns)

    def _spawn(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def later(self, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await asyncio.sleep(seconds)
            await work()

        self._spawn(run())

    def expire_after(self, obj: Obj, ttl: int | None) -> None:
        """The TTL-after-finished controllers: delete a finished workload `ttl` seconds later."""
        uid = obj["metadata"]["uid"]
        if ttl is None or uid in self._expiring:
            return
        self._expiring.add(uid)
        plural = next(r.plural for r in RESOURCES if r.kind == obj["kind"])
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]

        async def expire() -> None:
            cur = self.get(plural, ns, name)
            if cur is not None and cur["metadata"]["uid"] == uid:
                await self.delete(plural, ns, name)

        self.later(ttl, expire)

    async def _emit(self, plural: str, kind: str, obj: Obj) -> None:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        self.events.append((rv, plural, kind, copy.deepcopy(obj)))
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()
        self._dispatch(plural, kind, obj)

    async def modified(self, plural: str, obj: Obj) -> None:
        await self._emit(plural, "MODIFIED", obj)

    def _stored(self, plural: str, ns: str, obj: Obj) -> Obj:
        """What the API server adds on create: uid, defaults, Kueue's webhook."""
        obj = copy.deepcopy(obj)
        obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now())
        if plural == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            data.update({k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()})
        if plural == "pods":
            obj["status"] = {"phase": "Pending"}
        if plural == "jobs":
            default_job(obj)
        if plural == "jobsets":
            default_jobset(obj)
        if plural in ("jobs", "jobsets"):
            self.kueue.on_create(obj)
        return obj

    def _refusal(self, plural: str, ns: str, obj: Obj) -> tuple[int, str, str] | None:
        kind, name = self.resources[plural].kind, obj.get("metadata", {}).get("name", "")
        if self.validate:
            try:
                schemas.validate(obj, self.version)
            except schemas.Invalid as e:
                self.rejected.append(str(e))
                return 422, "Invalid", f'{kind} "{name}" is invalid: {e}'
        if (plural, ns, name) in self.objects:
            return 409, "AlreadyExists", f'{plural} "{name}" already exists'
        running = [p for p in self.items("pods", ns) if p["status"]["phase"] not in ("Succeeded", "Failed")]
        if plural == "pods" and self.pod_quota is not None and len(running) >= self.pod_quota:
            return 403, "Forbidden", (f'pods "{name}" is forbidden: exceeded quota: compute-resources, requested: '
                                      f"pods=1, used: pods={self.pod_quota}, limited: pods={self.pod_quota}")
        return None

    async def _add(self, plural: str, ns: str, obj: Obj) -> Obj:
        obj = self._stored(plural, ns, obj)
        self.objects[(plural, ns, obj["metadata"]["name"])] = obj
        await self._emit(plural, "ADDED", obj)
        if plural == "pods":
            self._spawn(self._kubelet(ns, obj["metadata"]["name"]))
        return obj

    async def create_by_controller(self, plural: str, ns: str, obj: Obj, owner: Obj) -> bool:
        """A controller's create: a refusal becomes a FailedCreate event on the owner, as there."""
        refused = self._refusal(plural, ns, obj)
        if refused is None:
            await self._add(plural, ns, obj)
            return True
        event = {"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "FailedCreate",
                 "message": f"Error creating: {refused[2]}", "lastTimestamp": now(),
                 "involvedObject": {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                    "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                    "namespace": ns},
                 "metadata": {"name": f"{owner['metadata']['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns}}
        await self._add("events", ns, event)
        return False

    async def delete(self, plural: str, ns: str, name: str, orphan: bool = False) -> None:
        obj = self.objects.pop((plural, ns, name), None)
        if obj is None:
            return
        await self._emit(plural, "DELETED", obj)
        if orphan:
            return
        uid = obj["metadata"]["uid"]  # the garbage collector: dependents go with their owner
        for (p, n, child), o in list(self.objects.items()):
            if n == ns and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []):
                await self.delete(p, n, child)

    # ---- the controllers' work queue ----
    def _dispatch(self, plural: str, kind: str, obj: Obj) -> None:
        assert self._work is not None
        ns = obj["metadata"].get("namespace", "")
        keys = []
        if plural in ("jobs", "jobsets") and kind != "DELETED":
            keys.append((plural, ns, obj["metadata"]["name"]))
            self.kueue.watch(plural, obj)
        for ref in obj["metadata"].get("ownerReferences") or []:
            owner = {"Job": "jobs", "JobSet": "jobsets"}.get(ref["kind"])
            if owner:
                keys.append((owner, ns, ref["name"]))
        for key in keys:
            if key not in self._pending:
                self._pending.add(key)
                self._work.put_nowait(key)

    async def _controllers(self) -> None:
        assert self._work is not None
        while True:
            key = await self._work.get()
            self._pending.discard(key)
            plural, ns, name = key
            controller = self.jobs if plural == "jobs" else self.jobsets
            await controller.reconcile(ns, name)

    # ---- discovery: what kubectl asks before it maps a manifest's kind to a URL ----
    async def _version(self, req: web.Request) -> web.Response:
        major, minor = self.version.split(".")
        return web.json_response({
            "major": major, "minor": minor, "gitVersion": f"v{self.version}.2", "gitCommit": "0" * 40,
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.4", "compiler": "gc",
            "platform": "linux/amd64"})

    def _serves_success_policy(self) -> bool:
        major, minor = (int(x) for x in self.version.split("."))
        return (major, minor) >= (1, 31)

    def _dropped(self, plural: str, obj: Obj) -> Obj:
        """What an API server of this version keeps of a create: a Job's successPolicy only from 1.31 on."""
        if plural not in ("jobs", "jobsets") or self._serves_success_policy():
            return obj
        obj = copy.deepcopy(obj)
        specs = [obj.get("spec", {})] if plural == "jobs" else [
            r.get("template", {}).get("spec", {}) for r in obj.get("spec", {}).get("replicatedJobs", [])]
        for spec in specs:
            spec.pop("successPolicy", None)
        return obj

    async def _api_versions(self, req: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})

    def _group_versions(self) -> dict[str, list[Resource]]:
        out: dict[str, list[Resource]] = collections.defaultdict(list)
        for r in self.resources.values():
            out[r.group_version].append(r)
        return out

    async def _api_groups(self, req: web.Request) -> web.Response:
        groups = [
            {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
             "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
            for gv in self._group_versions() if gv != "v1"
        ]
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _api_resources(self, req: web.Request) -> web.Response:
        gv = "/".join(filter(None, (req.match_info.get("group"), req.match_info["version"])))
        if gv not in self._group_versions():
            return _status(404, "NotFound", "the server could not find the requested resource")
        verbs = ["create", "delete", "get", "list", "patch", "watch"]
        resources = [{"name": r.plural, "singularName": r.kind.lower(), "namespaced": True, "kind": r.kind,
                      "verbs": verbs} for r in self._group_versions()[gv]]
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                                  "resources": resources})

    # ---- the API ----
    def _resource(self, req: web.Request) -> Resource | None:
        gv = "/".join(filter(None, (req.match_info.get("group"), req.match_info["version"])))
        r = self.resources.get(req.match_info["plural"])
        return r if r is not None and r.group_version == gv else None

    async def _collection(self, req: web.Request) -> web.StreamResponse:
        ns, plural = req.match_info["ns"], req.match_info["plural"]
        self.requests[f"{req.method} {plural}{' watch' if req.query.get('watch') else ''}"] += 1
        resource = self._resource(req)
        if resource is None:
            return _status(404, "NotFound", "the server could not find the requested resource")
        if req.method == "POST":
            obj = self._dropped(plural, await req.json())
            if self.on_create is not None:
                self.on_create(plural, obj, "received")
            refused = self._refusal(plural, ns, obj)
            if refused is not None:
                return _status(*refused)
            stored = await self._add(plural, ns, obj)
            if self.on_create is not None:
                self.on_create(plural, obj, "stored")
            return web.json_response(stored, status=201)
        if req.method != "GET":
            return _status(405, "MethodNotAllowed", req.method)
        labels, fields = req.query.get("labelSelector"), req.query.get("fieldSelector")
        if req.query.get("watch") in ("true", "1"):
            return await self._watch(req, ns, plural, labels, fields)
        items = [o for o in self.items(plural, ns) if _matches(o, labels, fields)]
        rv = str(self.events[-1][0]) if self.events else "0"
        return web.json_response({"kind": f"{resource.kind}List", "apiVersion": resource.group_version,
                                  "metadata": {"resourceVersion": rv}, "items": items})

    async def _item(self, req: web.Request) -> web.Response:
        ns, plural, name = req.match_info["ns"], req.match_info["plural"], req.match_info["name"]
        self.requests[f"{req.method} {plural}/name"] += 1
        if self._resource(req) is None:
            return _status(404, "NotFound", "the server could not find the requested resource")
        obj = self.get(plural, ns, name)
        if obj is None:
            return _status(404, "NotFound", f'{plural} "{name}" not found')
        if req.method == "GET":
            return web.json_response(obj)
        if req.method == "DELETE":
            body = await req.json() if req.can_read_body else {}
            uid = (body.get("preconditions") or {}).get("uid")
            if uid is not None and uid != obj["metadata"]["uid"]:
                return _status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, UID in object "
                               f"meta: {obj['metadata']['uid']}")
            policy = body.get("propagationPolicy") or req.query.get("propagationPolicy") or "Background"
            await self.delete(plural, ns, name, orphan=policy == "Orphan")
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if req.method == "PATCH":
            if req.content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                return _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: "
                               f"{req.content_type}")
            patched = _merge_patch(obj, await req.json())
            if self.validate:
                try:
                    schemas.validate({k: v for k, v in patched.items() if k != "status"}, self.version)
                except schemas.Invalid as e:
                    self.rejected.append(str(e))
                    return _status(422, "Invalid", f'{obj["kind"]} "{name}" is invalid: {e}')
            obj.clear()
            obj.update(patched)
            await self.modified(plural, obj)
            return web.json_response(obj)
        return _status(405, "MethodNotAllowed", req.method)

    async def _watch(
        self, req: web.Request, ns: str, plural: str, labels: str | None, fields: str | None
    ) -> web.StreamResponse:
        timeout = float(req.query.get("timeoutSeconds") or 30)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(req)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        assert self._changed is not None
        try:
            if req.query.get("resourceVersion") in (None, "", "0"):
                # no resourceVersion: the current state as ADDED events, then the changes from now on
                since = self.events[-1][0] if self.events else 0
                for obj in [o for o in self.items(plural, ns) if _matches(o, labels, fields)]:
                    await resp.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
            else:
                since = int(req.query["resourceVersion"])
            while loop.time() < end:
                for rv, p, kind, obj in [e for e in self.events if e[0] > since]:
                    since = rv
                    if p == plural and obj["metadata"].get("namespace") == ns and _matches(obj, labels, fields):
                        await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), max(0.01, end - loop.time()))
                    except TimeoutError:
                        break
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):  # the client went away
            pass
        return resp

    async def _log(self, req: web.Request) -> web.StreamResponse:
        ns, name = req.match_info["ns"], req.match_info["name"]
        self.requests["GET pods/log"] += 1
        pod = self.get("pods", ns, name)
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if pod["status"]["phase"] == "Pending":
            return _status(400, "BadRequest", f'container "{name}" in pod "{name}" is waiting to start')
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(req)
        sent = 0
        assert self._changed is not None
        try:
            while True:
                lines = self.logs[(ns, name)]
                for line in lines[sent:]:
                    await resp.write(line.encode())
                sent = len(lines)
                cur = self.get("pods", ns, name)
                if cur is None or cur["status"]["phase"] in TERMINAL or req.query.get("follow") != "true":
                    break
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 1)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):  # the client went away
            pass
        return resp

    # ---- the kubelet ----
    async def _set_status(self, ns: str, name: str, status: Obj) -> bool:
        pod = self.get("pods", ns, name)
        if pod is None:
            return False
        pod["status"] = status
        await self.modified("pods", pod)
        return True

    async def disrupt(self, ns: str, name: str) -> None:
        """A node drain: the pod gets the DisruptionTarget condition and fails (exit 143, SIGTERM)."""
        pod = self.get("pods", ns, name)
        assert pod is not None, name
        status = copy.deepcopy(pod["status"])
        status["phase"] = "Failed"
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                 "message": "Eviction API: evicting"}, {"type": "Ready", "status": "False"}]
        for cs in status.get("containerStatuses", []):
            cs["state"] = {"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": now()}}
        await self._set_status(ns, name, status)

    def _runs(self, pod: Obj) -> bool:
        """Whether the container runs to an end, from the runtime image's entrypoint modes."""
        args = pod["spec"]["containers"][0].get("args") or ["worker"]
        index = (pod["metadata"].get("labels") or {}).get(INDEX_KEY, "0")
        return not (args[0] == "worker" or (args[0] == "node" and index != "0"))

    async def _kubelet(self, ns: str, name: str) -> None:
        await asyncio.sleep(self.start_delay_s)
        pod = self.get("pods", ns, name)
        if pod is None:
            return
        c = pod["spec"]["containers"][0]
        base = {"name": c["name"], "restartCount": 0, "image": c["image"], "imageID": ""}
        if "does-not-exist" in c["image"]:
            waiting = {"reason": "ErrImagePull", "message": f'failed to pull image "{c["image"]}": not found'}
            await self._set_status(ns, name, {"phase": "Pending", "containerStatuses": [
                {**base, "ready": False, "state": {"waiting": waiting}}]})
            return
        n = next(self._ips)
        running: Obj = {
            "phase": "Running",
            "podIP": f"10.244.{n // 250}.{n % 250 + 2}",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{**base, "ready": True, "state": {"running": {"startedAt": now()}}}],
        }
        if not await self._set_status(ns, name, running):
            return
        if not self._runs(pod):  # a server (sshd): it runs until the pod is deleted, or node 0 has ended
            if any(e["name"] == LAUNCHER_NODE_ENV for e in c.get("env", [])) and c["args"][0] == "node" \
                    and await self._until_node_zero_ends(ns, pod):
                await self._exit(ns, name, running, 0)
            return
        argv = [kubelet_expand(a, {}) for a in c.get("command", []) + c["args"]]
        self.logs[(ns, name)].append(f"fake-kubelet: running {' '.join(argv)}\n")
        for vol in pod["spec"].get("volumes", []):
            cm = vol.get("configMap")
            if cm and (obj := self.get("configmaps", ns, cm["name"])):
                for key, text in obj.get("data", {}).items():
                    self.logs[(ns, name)].append(f"fake-kubelet: {cm['name']}/{key}:\n{text}")
        await asyncio.sleep(self.start_delay_s if self.run_s is None else self.run_s)
        index = int((pod["metadata"].get("labels") or {}).get(INDEX_KEY, "0"))
        await self._exit(ns, name, running, self.exit_codes.get(index, self.job_exit_code))

    async def _until_node_zero_ends(self, ns: str, pod: Obj) -> bool:
        """The entrypoint of a node > 0 told where node 0 is: it serves until node 0, seen once, is gone (its pod
        ended or deleted: its sshd no longer answers); True then, False when this pod ended first (deleted,
        drained)."""
        owners = {r["uid"] for r in pod["metadata"].get("ownerReferences") or []}
        seen = False
        while (me := self.get("pods", ns, pod["metadata"]["name"])) is not None and me["status"]["phase"] == "Running":
            zero = [p for p in self.items("pods", ns) if (p["metadata"].get("labels") or {}).get(INDEX_KEY) == "0"
                    and owners & {r["uid"] for r in p["metadata"].get("ownerReferences") or []}]
            if any(p["status"]["phase"] == "Running" for p in zero):
                seen = True
            elif seen:
                return True
            await asyncio.sleep(0.02)
        return False

    async def _exit(self, ns: str, name: str, running: Obj, code: int) -> None:
        done = copy.deepcopy(running)
        done["phase"] = "Succeeded" if code == 0 else "Failed"
        done["conditions"] = [{"type": "Ready", "status": "False"}]
        done["containerStatuses"][0]["ready"] = False
        done["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "finishedAt": now()}
        }
        await self._set_status(ns, name, done)

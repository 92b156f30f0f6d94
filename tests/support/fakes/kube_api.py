"""A small fake Kubernetes API server over real HTTP (aiohttp), plus a fake kubelet.

It answers the calls envpipe-launch makes the way kube-apiserver does: create (201; 409 on an existing
name; 422 when the object fails the official schema via kubernetes-validate; 403 on a pod quota),
get (404), list/watch with labelSelector/fieldSelector and resourceVersion (JSON-lines watch stream),
delete with propagationPolicy (the garbage collector follows ownerReferences), and pod logs with
follow=true; and the discovery documents (/api, /api/v1, /apis) that kubectl reads first. The kubelet
moves pods Pending -> Running (pod IP, Ready) or into ErrImagePull for images containing
"does-not-exist"; worker pods (the image's `worker` mode, sshd) run until deleted, others "run" to
completion: their log is the command plus the files of mounted ConfigMaps, and their exit code is
`job_exit_code`.
It is not a real API server: no admission beyond schemas and quota, no RBAC, no scheduling.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import itertools
import json
import threading
import uuid

import kubernetes_validate
from aiohttp import web

KINDS = {"pods": "Pod", "services": "Service", "secrets": "Secret", "configmaps": "ConfigMap"}
K8S_VERSION = "1.33"


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _matches(obj: dict, labels: str | None, fields: str | None) -> bool:
    have = obj["metadata"].get("labels") or {}
    for term in filter(None, (labels or "").split(",")):
        k, _, v = term.partition("=")
        if have.get(k) != v:
            return False
    for term in filter(None, (fields or "").split(",")):
        k, _, v = term.partition("=")
        if k == "metadata.name" and obj["metadata"]["name"] != v:
            return False
    return True


class FakeKubeAPI:
    def __init__(
        self,
        pod_quota: int | None = None,
        job_exit_code: int = 0,
        start_delay_s: float = 0.02,
        validate: bool = True,
        run_s: float | None = None,
    ) -> None:
        self.pod_quota, self.job_exit_code, self.start_delay_s = pod_quota, job_exit_code, start_delay_s
        self.validate = validate
        self.run_s = run_s  # how long a job container runs; default start_delay_s
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.events: list[tuple[int, str, str, dict]] = []  # (rv, plural, type, object)
        self.logs: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        self.requests: collections.Counter[str] = collections.Counter()
        self.rejected: list[str] = []  # validation messages of 422 answers
        self._rv = itertools.count(1)
        self._ips = itertools.count(2)
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._kubelets: set[asyncio.Task] = set()  # pods still being started: cancelled at stop
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
        app = web.Application()
        app.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}", self._collection)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}/{name}", self._item)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._log)
        app.router.add_get("/api", self._api_versions)
        app.router.add_get("/api/v1", self._api_resources)
        app.router.add_get("/apis", self._api_groups)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        assert self._runner is not None
        for task in self._kubelets:
            task.cancel()
        await asyncio.gather(*self._kubelets, return_exceptions=True)
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def names(self, plural: str) -> list[str]:
        return sorted(n for (p, _, n) in list(self.objects) if p == plural)

    # ---- discovery: what kubectl asks before it maps a manifest's kind to a URL ----
    async def _api_versions(self, req: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})

    async def _api_groups(self, req: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def _api_resources(self, req: web.Request) -> web.Response:
        verbs = ["create", "delete", "get", "list", "watch"]
        resources = [
            {"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind, "verbs": verbs}
            for plural, kind in KINDS.items()
        ]
        return web.json_response(
            {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": resources}
        )

    # ---- storage ----
    async def _emit(self, plural: str, kind: str, obj: dict) -> None:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        self.events.append((rv, plural, kind, copy.deepcopy(obj)))
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _collection(self, req: web.Request) -> web.StreamResponse:
        ns, plural = req.match_info["ns"], req.match_info["plural"]
        self.requests[f"{req.method} {plural}{' watch' if req.query.get('watch') else ''}"] += 1
        if plural not in KINDS:
            return _status(404, "NotFound", f"the server could not find the requested resource ({plural})")
        if req.method == "POST":
            return await self._create(ns, plural, await req.json())
        if req.method != "GET":
            return _status(405, "MethodNotAllowed", req.method)
        labels, fields = req.query.get("labelSelector"), req.query.get("fieldSelector")
        if req.query.get("watch") in ("true", "1"):
            return await self._watch(req, ns, plural, labels, fields)
        items = [
            o
            for (p, n, _), o in self.objects.items()
            if p == plural and n == ns and _matches(o, labels, fields)
        ]
        rv = str(self.events[-1][0]) if self.events else "0"
        return web.json_response(
            {
                "kind": f"{KINDS[plural]}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": rv},
                "items": items,
            }
        )

    async def _create(self, ns: str, plural: str, obj: dict) -> web.Response:
        name = obj.get("metadata", {}).get("name", "")
        if self.validate:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                self.rejected.append(e.message)
                return _status(422, "Invalid", f'{KINDS[plural]} "{name}" is invalid: {e.message}')
        if (plural, ns, name) in self.objects:
            return _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
        if plural == "pods" and self.pod_quota is not None and len(self.names("pods")) >= self.pod_quota:
            return _status(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: exceeded quota: compute-resources, '
                f"requested: pods=1, used: pods={self.pod_quota}, "
                f"limited: pods={self.pod_quota}",
            )
        obj = copy.deepcopy(obj)
        obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()))
        if plural == "secrets" and "stringData" in obj:
            obj["data"] = {k: "<base64>" for k in obj.pop("stringData")}
        if plural == "pods":
            obj["status"] = {"phase": "Pending"}
        self.objects[(plural, ns, name)] = obj
        await self._emit(plural, "ADDED", obj)
        if plural == "pods":
            task = asyncio.get_running_loop().create_task(self._kubelet(ns, name))
            self._kubelets.add(task)
            task.add_done_callback(self._kubelets.discard)
        return web.json_response(obj, status=201)

    async def _item(self, req: web.Request) -> web.Response:
        ns, plural, name = req.match_info["ns"], req.match_info["plural"], req.match_info["name"]
        self.requests[f"{req.method} {plural}/name"] += 1
        obj = self.objects.get((plural, ns, name))
        if obj is None:
            return _status(404, "NotFound", f'{plural} "{name}" not found')
        if req.method == "GET":
            return web.json_response(obj)
        if req.method == "DELETE":
            body = await req.json() if req.can_read_body else {}
            policy = body.get("propagationPolicy") or req.query.get("propagationPolicy") or "Background"
            await self._delete(plural, ns, name, orphan=policy == "Orphan")
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
        return _status(405, "MethodNotAllowed", req.method)

    async def _delete(self, plural: str, ns: str, name: str, orphan: bool) -> None:
        obj = self.objects.pop((plural, ns, name), None)
        if obj is None:
            return
        await self._emit(plural, "DELETED", obj)
        if orphan:
            return
        uid = obj["metadata"]["uid"]  # the garbage collector: dependents go with their owner
        for (p, n, child), o in list(self.objects.items()):
            if n == ns and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []):
                await self._delete(p, n, child, orphan=False)

    async def _watch(
        self, req: web.Request, ns: str, plural: str, labels: str | None, fields: str | None
    ) -> web.StreamResponse:
        since = int(req.query.get("resourceVersion") or 0)
        timeout = float(req.query.get("timeoutSeconds") or 30)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(req)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        assert self._changed is not None
        try:
            while loop.time() < end:
                for rv, p, kind, obj in [e for e in self.events if e[0] > since]:
                    since = rv
                    if (
                        p == plural
                        and obj["metadata"].get("namespace") == ns
                        and _matches(obj, labels, fields)
                    ):
                        await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), max(0.01, end - loop.time()))
                    except TimeoutError:
                        break
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        await resp.write_eof()
        return resp

    async def _log(self, req: web.Request) -> web.StreamResponse:
        ns, name = req.match_info["ns"], req.match_info["name"]
        self.requests["GET pods/log"] += 1
        pod = self.objects.get(("pods", ns, name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if pod["status"]["phase"] == "Pending":
            return _status(400, "BadRequest", f'container "{name}" in pod "{name}" is waiting to start')
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(req)
        sent = 0
        assert self._changed is not None
        while True:
            lines = self.logs[(ns, name)]
            for line in lines[sent:]:
                await resp.write(line.encode())
            sent = len(lines)
            cur = self.objects.get(("pods", ns, name))
            if (
                cur is None
                or cur["status"]["phase"] in ("Succeeded", "Failed")
                or req.query.get("follow") != "true"
            ):
                break
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 1)
        await resp.write_eof()
        return resp

    # ---- the kubelet ----
    async def _set_status(self, ns: str, name: str, status: dict) -> bool:
        pod = self.objects.get(("pods", ns, name))
        if pod is None:
            return False
        pod["status"] = status
        await self._emit("pods", "MODIFIED", pod)
        return True

    async def _kubelet(self, ns: str, name: str) -> None:
        await asyncio.sleep(self.start_delay_s)
        pod = self.objects.get(("pods", ns, name))
        if pod is None:
            return
        c = pod["spec"]["containers"][0]
        if "does-not-exist" in c["image"]:
            waiting = {"reason": "ErrImagePull", "message": f'failed to pull image "{c["image"]}": not found'}
            await self._set_status(
                ns,
                name,
                {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "name": c["name"],
                            "ready": False,
                            "restartCount": 0,
                            "image": c["image"],
                            "imageID": "",
                            "state": {"waiting": waiting},
                        }
                    ],
                },
            )
            return
        n = next(self._ips)
        ip = f"10.244.{n // 250}.{n % 250 + 2}"
        running = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "ready": True,
                    "restartCount": 0,
                    "image": c["image"],
                    "imageID": "",
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        }
        if not await self._set_status(ns, name, running):
            return
        command = " ".join(c.get("command", []) + c.get("args", []))
        if c.get("args") == ["worker"]:
            return  # a worker: the image's entrypoint runs sshd until the pod is deleted
        self.logs[(ns, name)].append(f"fake-kubelet: running {command}\n")
        for vol in pod["spec"].get("volumes", []):
            cm = vol.get("configMap")
            if cm and (obj := self.objects.get(("configmaps", ns, cm["name"]))):
                for key, text in obj.get("data", {}).items():
                    self.logs[(ns, name)].append(f"fake-kubelet: {cm['name']}/{key}:\n{text}")
        await asyncio.sleep(self.start_delay_s if self.run_s is None else self.run_s)
        code = self.job_exit_code
        done = copy.deepcopy(running)
        done["phase"] = "Succeeded" if code == 0 else "Failed"
        done["conditions"] = [{"type": "Ready", "status": "False"}]
        done["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        }
        await self._set_status(ns, name, done)

"""The HTTP API of envpipe-clockd on aiohttp: the edge middleware, thin routes, and the serving loop.

Routes parse into typed commands (protocol.py), call the service, and map ClockError to a status in
one place. The edge (guard.py) admits connections and counts requests before any route runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from envpipe.clock.errors import (
    BadRequest,
    BodyTooLarge,
    ClockError,
    ForeignRequest,
    NoRoute,
    RequestTimeout,
    TooManyRequests,
    UnsupportedMediaType,
)
from envpipe.clock.guard import Conn, ConnectionGate, RateLimiter, RefusalLog
from envpipe.clock.identity import watch_exit
from envpipe.clock.listen import Listeners, ServeOptions
from envpipe.clock.metrics import envpipe_version
from envpipe.clock.protocol import API, MAX_BODY_BYTES, POD_HEADER, Lock, OpenLease, Reset, pod_claim
from envpipe.clock.service import ClockService

log = logging.getLogger("envpipe.clockd")
SERVICE: web.AppKey[ClockService] = web.AppKey("service", ClockService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Edge:
    """What the middleware needs of the serving side."""

    gate: ConnectionGate
    limiter: RateLimiter
    refusals: RefusalLog
    tcp_hosts: frozenset[str]
    body_timeout_s: float


EDGE: web.AppKey[Edge] = web.AppKey("edge", Edge)
CLAIMED_POD: web.RequestKey[str | None] = web.RequestKey("claimed_pod", str)  # X-Envpipe-Pod, parsed once


def _error(exc: ClockError) -> web.Response:
    resp = web.json_response(exc.to_json(), status=exc.status)
    if isinstance(exc, RequestTimeout):
        resp.force_close()  # the rest of the body may still come: do not read it
    return resp


def _check_edge(request: web.Request, edge: Edge, conn: Conn, key: str) -> None:
    if not edge.limiter.take(key):
        raise TooManyRequests("rate limit exceeded; slow down")
    if conn.listener == "tcp":  # a browser can reach loopback TCP; it cannot reach a Unix socket
        if request.headers.get("Host") not in edge.tcp_hosts:
            raise ForeignRequest(f"Host {request.headers.get('Host')!r} is not this daemon (DNS rebinding?)")
        if "Origin" in request.headers:
            raise ForeignRequest("requests from web pages (with an Origin header) are refused")
    if request.method == "POST" and request.body_exists and request.content_type != "application/json":
        raise UnsupportedMediaType(f"POST bodies must be Content-Type application/json, not {request.content_type!r}")


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    edge = request.app[EDGE]
    conn = edge.gate.conn(request.protocol)
    key = conn.peer.rate_key(None)
    try:
        request[CLAIMED_POD] = claim = pod_claim(request.headers.get(POD_HEADER))
        key = conn.peer.rate_key(claim)
        _check_edge(request, edge, conn, key)
        edge.gate.begin(conn)
        try:
            return await handler(request)
        finally:
            edge.gate.end(conn)
    except web.HTTPRequestEntityTooLarge:
        exc: ClockError = BodyTooLarge(f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    except web.HTTPException as http:  # the router's 404 and 405
        exc = NoRoute(http.status, http.reason)
    except ClockError as refusal:
        exc = refusal
    except ConnectionError:  # the client went away mid-request: nothing to answer, nothing to report
        log.debug("%s %s: client went away", request.method, request.path)
        return web.Response(status=499)
    except Exception:  # a bug: never let one request take the daemon down; log it for the operator
        log.exception("internal error on %s %s", request.method, request.path)
        return web.json_response({"error": "internal", "message": "internal error (see the daemon log)"}, status=500)
    edge.refusals.refused(exc.status, exc.code, f"{request.method} {request.path}", key, exc.message)
    request.app[SERVICE].metrics.refused.labels(code=exc.code).inc()
    return _error(exc)


routes = web.RouteTableDef()


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise BodyTooLarge(f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    timeout = request.app[EDGE].body_timeout_s
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g} s") from None


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """Liveness: answers while the event loop runs; a degraded GPU is reported, not fatal."""
    return web.json_response({**request.app[SERVICE].health(), "version": envpipe_version()})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    if svc.ready:
        return web.json_response({"ready": True})
    why = "start-up resets still running" if not svc.started else f"unhealthy GPU(s): {svc.faults()}"
    return web.json_response({"ready": False, "error": "not_ready", "message": why}, status=503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.refresh_metrics()
    svc.metrics.connections.set(request.app[EDGE].gate.count())
    return web.Response(body=generate_latest(svc.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


@routes.get(API + "/gpus")
async def list_gpus(request: web.Request) -> web.Response:
    return web.json_response({"gpus": await request.app[SERVICE].gpus()})


@routes.get(API + "/gpus/{uuid}")
async def get_gpu(request: web.Request) -> web.Response:
    return web.json_response(await request.app[SERVICE].gpu(request.match_info["uuid"]))


@routes.post(API + "/gpus/{uuid}/lock")
async def lock(request: web.Request) -> web.Response:
    cmd = Lock.parse(await _body(request))
    return web.json_response(await request.app[SERVICE].lock(request.match_info["uuid"], cmd.lease, cmd.mhz))


@routes.post(API + "/gpus/{uuid}/reset")
async def reset(request: web.Request) -> web.Response:
    cmd = Reset.parse(await _body(request))
    await request.app[SERVICE].reset(request.match_info["uuid"], cmd.lease)
    return web.json_response({"uuid": request.match_info["uuid"], "reset": True})


@routes.post(API + "/leases")
async def open_lease(request: web.Request) -> web.Response:
    cmd = OpenLease.parse(await _body(request))
    conn = request.app[EDGE].gate.conn(request.protocol)
    lease = await request.app[SERVICE].open_lease(conn.peer, cmd.pod, cmd.gpus, cmd.ttl_s, request[CLAIMED_POD])
    return web.json_response(lease.to_json(time.monotonic()), status=201)


@routes.post(API + "/leases/{lease}/renew")
async def renew(request: web.Request) -> web.Response:
    if await _body(request) not in (b"", b"{}"):
        raise BadRequest("renew takes no body")
    lease = request.app[SERVICE].leases.renew(request.match_info["lease"])
    return web.json_response(lease.to_json(time.monotonic()))


@routes.delete(API + "/leases/{lease}")
async def close_lease(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    svc.leases.get(request.match_info["lease"])  # 404 for unknown leases
    await svc.end_lease(request.match_info["lease"], "closed by client")
    return web.json_response({"closed": True})


@routes.get(API + "/leases/{lease}/attach")
async def attach(request: web.Request) -> web.StreamResponse:
    """Held open by the client for the lease's lifetime. The lease ends (and its GPUs are reset) at once
    when the connection goes away, or, where the daemon can see the attaching process, when that
    process exits, even if forked children still hold a copy of the connection."""
    svc = request.app[SERVICE]
    lease_id = request.match_info["lease"]
    svc.leases.get(lease_id)
    conn = request.app[EDGE].gate.conn(request.protocol)
    unwatch = watch_exit(conn.peer, lambda: svc.end_lease_soon(lease_id, "owner process exited"))
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    try:
        await resp.prepare(request)
        while svc.leases.is_open(lease_id):
            transport = request.transport
            if transport is None or transport.is_closing():
                await svc.end_lease(lease_id, "client disconnected")
                break
            await resp.write(b".")
            await asyncio.sleep(0.1)
    except (ConnectionError, asyncio.CancelledError):
        await asyncio.shield(svc.end_lease(lease_id, "client disconnected"))
        raise
    finally:
        if unwatch is not None:
            unwatch()
    return resp


def make_app(service: ClockService, edge: Edge, probes_only: bool = False) -> web.Application:
    app = web.Application(middlewares=[edge_middleware], client_max_size=MAX_BODY_BYTES)
    app[SERVICE] = service
    app[EDGE] = edge
    if probes_only:  # the metrics port: Prometheus and the kubelet's probes, no clock API
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
    else:
        app.router.add_routes(routes)
    return app


async def serve_http(
    service: ClockService,
    listeners: Listeners,
    opts: ServeOptions,
    connection_limit: int,
    stop: asyncio.Event,
    ready: Callable[[], None] | None = None,
) -> None:
    """Serve the API on the listeners until ``stop``, then stop the service (its GPUs reset) and clean up."""
    gate = ConnectionGate(connection_limit)
    limiter = RateLimiter(opts.max_rps, opts.max_rps)
    edge = Edge(gate, limiter, RefusalLog(), listeners.tcp_hosts, opts.body_timeout_s)
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task[None]] = []
    for sock, name in ((listeners.unix, "unix"), (listeners.tcp, "tcp"), (listeners.metrics, "metrics")):
        if sock is None:
            continue
        runner = web.AppRunner(
            make_app(service, edge, probes_only=name == "metrics"),
            access_log=None,
            keepalive_timeout=opts.header_timeout_s,  # aiohttp closes a connection idle or mid-head this long
            shutdown_timeout=1.0,
        )
        await runner.setup()
        runners.append(runner)
        sock.setblocking(False)
        assert runner.server is not None  # made by setup()
        tasks.append(asyncio.create_task(gate.accept_forever(sock, name, runner.server)))
    tasks.append(asyncio.create_task(service.reap_forever()))
    log.info(
        "envpipe-clockd %s up: backend=%s ownership=%s gpus=%d socket=%s tcp=%s metrics_port=%s ready=%s",
        envpipe_version(),
        service.backend.name,
        service.policy.name,
        len(service.backend.gpus()),
        opts.socket_path,
        opts.tcp,
        opts.metrics_port or "off",
        service.ready,
    )
    if ready:
        ready()
    try:
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        listeners.close()
        await service.stop()
        for runner in runners:
            await runner.cleanup()
        service.close()
        log.info("envpipe-clockd stopped; its GPUs reset")

"""The HTTP API of envpipe-clockd on aiohttp: the edge middleware, thin routes, and the serving loop.

Routes parse into typed commands (protocol.py), call the service and nothing else, and map ClockError to
a status in one place. A request is served once its body has arrived (``serving``): then it is counted
against its caller's rate and requests in flight (ratelimit.py). Connections are admitted by guard.py. The
metrics port (the kubelet's probes, Prometheus) has an edge of its own, so no flood of the API reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
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
from envpipe.clock.guard import Conn, ConnectionGate
from envpipe.clock.identity import watch_exit
from envpipe.clock.listen import Lifecycle, Listeners, ServeOptions
from envpipe.clock.logs import Throttle, event, log
from envpipe.clock.metrics import DaemonMetrics, envpipe_version
from envpipe.clock.protocol import (
    ATTACH,
    GPU,
    GPUS,
    LEASE,
    LEASES,
    LOCK,
    MAX_BODY_BYTES,
    POD_HEADER,
    RENEW,
    RESET,
    Lock,
    OpenLease,
    Reset,
    pod_claim,
)
from envpipe.clock.ratelimit import InFlight, RateLimiter, lease_key
from envpipe.clock.service import ClockService

SERVICE: web.AppKey[ClockService] = web.AppKey("service", ClockService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The metrics port's own limits: a kubelet and a Prometheus or two, never the API's callers.
PROBE_CONNECTIONS, PROBE_CONNECTIONS_PER_CALLER, PROBE_IN_FLIGHT = 32, 8, 16


@dataclass
class Edge:
    """What the middleware needs of one side of the daemon (the API listeners, or the metrics port)."""

    gate: ConnectionGate
    limiter: RateLimiter
    in_flight: InFlight
    tcp_hosts: frozenset[str]
    body_timeout_s: float
    lines: Throttle  # refusals and bad HTTP: one line a second per caller and kind


EDGE: web.AppKey[Edge] = web.AppKey("edge", Edge)
CONN: web.RequestKey[Conn] = web.RequestKey("conn", Conn)
CALLER: web.RequestKey[str] = web.RequestKey("caller", str)  # whose budget the request is counted in
CLAIMED_POD: web.RequestKey[str | None] = web.RequestKey("claimed_pod", str)  # X-Envpipe-Pod, parsed once


def _error(exc: ClockError) -> web.Response:
    resp = web.json_response(exc.to_json(), status=exc.status)
    if isinstance(exc, RequestTimeout):
        resp.force_close()  # the rest of the body may still come: do not read it
    return resp


def _check_edge(request: web.Request, edge: Edge, conn: Conn) -> None:
    if conn.listener == "tcp":  # a browser can reach loopback TCP; it cannot reach a Unix socket
        if request.headers.get("Host") not in edge.tcp_hosts:
            raise ForeignRequest(f"Host {request.headers.get('Host', '')[:80]!r} is not this daemon (DNS rebinding?)")
        if "Origin" in request.headers:
            raise ForeignRequest("requests from web pages (with an Origin header) are refused")
    if request.method == "POST" and request.body_exists and request.content_type != "application/json":
        raise UnsupportedMediaType(
            f"POST bodies must be Content-Type application/json, not {request.content_type[:80]!r}"
        )


def _refused(request: web.Request, exc: ClockError) -> None:
    """One log line per refusal, at most one a second per caller and code (saying how many it stands for)."""
    edge, svc = request.app[EDGE], request.app[SERVICE]
    svc.metrics.refused.labels(code=exc.code).inc()
    caller = request.get(CALLER, "unknown")
    held = edge.lines.pass_(f"{caller} {exc.code}")
    if held is None:
        return
    line = event(
        "refused",
        status=exc.status,
        code=exc.code,
        method=request.method,
        path=request.path,
        caller=caller,
        message=exc.message,
        **({"more": held} if held else {}),
    )
    log.log(logging.WARNING if exc.status >= 500 else logging.INFO, line)


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    edge = request.app[EDGE]
    conn = edge.gate.conn(request.protocol)
    if conn is None:  # closed to make room while its request head was on the way
        return web.Response(status=499)
    request[CONN] = conn
    request[CALLER] = conn.caller
    edge.gate.begin(conn)
    try:
        request[CLAIMED_POD] = pod_claim(request.headers.get(POD_HEADER))
        _check_edge(request, edge, conn)
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        exc: ClockError = BodyTooLarge(f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    except web.HTTPException as http:  # the router's 404 and 405
        exc = NoRoute(http.status, http.reason)
    except ClockError as refusal:
        exc = refusal
    except ConnectionError:  # the client went away mid-request: nothing to answer, nothing to report
        log.debug(event("client_gone", method=request.method, path=request.path, caller=request[CALLER]))
        return web.Response(status=499)
    except Exception as bug:  # never let one request take the daemon down; tell the operator, once a second
        request.app[SERVICE].metrics.internal_errors.inc()
        held = edge.lines.pass_("internal")
        if held is not None:
            log.error(event("internal_error", method=request.method, path=request.path, more=held), exc_info=bug)
        return web.json_response({"error": "internal", "message": "internal error (see the daemon log)"}, status=500)
    finally:
        edge.gate.end(conn)
    _refused(request, exc)
    return _error(exc)


@contextlib.contextmanager
def serving(request: web.Request, lease_id: str | None = None) -> Iterator[None]:
    """Count the request against its caller (ratelimit.py): the lease it names, if that lease exists;
    else the lease its connection served before, else the peer. 429 over the caller's rate or requests
    in flight. While it is served, its connection is not closed to make room for others."""
    edge, conn = request.app[EDGE], request[CONN]
    if lease_id is not None and request.app[SERVICE].lease_exists(lease_id):
        conn.lease_key = lease_key(lease_id)
    key = request[CALLER] = conn.caller
    if not edge.limiter.take(key):
        raise TooManyRequests("rate limit exceeded; slow down")
    with edge.in_flight.admit(key):
        conn.working += 1
        try:
            yield
        finally:
            conn.working -= 1


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise BodyTooLarge(f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    timeout = request.app[EDGE].body_timeout_s
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g} s") from None


routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """Liveness: answers while the event loop runs; a degraded GPU or state file is reported, not fatal."""
    with serving(request):
        return web.json_response({**request.app[SERVICE].health(), "version": envpipe_version()})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    with serving(request):
        why = request.app[SERVICE].not_ready()
    if why is None:
        return web.json_response({"ready": True})
    return web.json_response({"ready": False, "error": "not_ready", "message": why}, status=503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    with serving(request):
        svc = request.app[SERVICE]
        await svc.refresh_metrics()
        body = generate_latest(svc.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@routes.get(GPUS)
async def list_gpus(request: web.Request) -> web.Response:
    with serving(request):
        return web.json_response({"gpus": await request.app[SERVICE].gpus()})


@routes.get(GPU)
async def get_gpu(request: web.Request) -> web.Response:
    with serving(request):
        return web.json_response(await request.app[SERVICE].gpu(request.match_info["uuid"]))


@routes.post(LOCK)
async def lock(request: web.Request) -> web.Response:
    cmd = Lock.parse(await _body(request))
    with serving(request, cmd.lease):
        return web.json_response(await request.app[SERVICE].lock(request.match_info["uuid"], cmd.lease, cmd.mhz))


@routes.post(RESET)
async def reset(request: web.Request) -> web.Response:
    cmd = Reset.parse(await _body(request))
    with serving(request, cmd.lease):
        await request.app[SERVICE].reset(request.match_info["uuid"], cmd.lease)
    return web.json_response({"uuid": request.match_info["uuid"], "reset": True})


@routes.post(LEASES)
async def open_lease(request: web.Request) -> web.Response:
    cmd = OpenLease.parse(await _body(request))
    with serving(request):
        svc, peer = request.app[SERVICE], request[CONN].peer
        lease = await svc.open_lease(peer, cmd.pod, cmd.gpus, cmd.ttl_s, request[CLAIMED_POD])
    return web.json_response(lease, status=201)


@routes.post(RENEW)
async def renew(request: web.Request) -> web.Response:
    if await _body(request) not in (b"", b"{}"):
        raise BadRequest("renew takes no body")
    with serving(request, request.match_info["lease"]):
        return web.json_response(request.app[SERVICE].renew(request.match_info["lease"]))


@routes.delete(LEASE)
async def close_lease(request: web.Request) -> web.Response:
    with serving(request, request.match_info["lease"]):
        await request.app[SERVICE].close_lease(request.match_info["lease"])
    return web.json_response({"closed": True})


@routes.get(ATTACH)
async def attach(request: web.Request) -> web.StreamResponse:
    """Held open by the client for the lease's lifetime, one per lease. The lease ends (and its GPUs are
    reset) at once when the connection goes away, or, where the daemon can see the attaching process,
    when that process exits, even if forked children still hold a copy of the connection."""
    svc, conn, lease_id = request.app[SERVICE], request[CONN], request.match_info["lease"]
    if svc.lease_exists(lease_id):
        conn.lease_key = lease_key(lease_id)
    key = request[CALLER] = conn.caller
    if not request.app[EDGE].limiter.take(key):
        raise TooManyRequests("rate limit exceeded; slow down")
    svc.attach(lease_id)  # 404 for unknown leases, 409 for a second stream
    conn.working += 1  # a stream is never closed to make room
    unwatch = watch_exit(conn.peer, lambda: svc.end_lease_soon(lease_id, "owner process exited"))
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    try:
        if request.transport is None or request.transport.is_closing():
            # closed before the stream began (to make room, while this request waited to be served):
            # the client never had the stream, so its going ends nothing; the client asks again
            raise ConnectionResetError("the connection closed before the attach stream began")
        await resp.prepare(request)
        while svc.lease_exists(lease_id):
            transport = request.transport
            if transport is None or transport.is_closing():
                await svc.end_lease(lease_id, "client disconnected")
                break
            await resp.write(b".")
            await asyncio.sleep(0.1)
    except (ConnectionError, asyncio.CancelledError):
        if resp.prepared:
            await asyncio.shield(svc.end_lease(lease_id, "client disconnected"))
        raise
    finally:
        conn.working -= 1
        svc.detach(lease_id)
        if unwatch is not None:
            unwatch()
    return resp


class HttpErrorLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's logger for one connection. A request aiohttp cannot parse is counted in a metric and
    logged once a second per caller, one line without a traceback (aiohttp logs a traceback each)."""

    def __init__(self, conn: Conn, edge: Edge, metrics: DaemonMetrics) -> None:
        super().__init__(log, {})
        self.conn, self.edge, self.metrics = conn, edge, metrics

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self.metrics.bad_http.labels(listener=self.conn.listener).inc()
            held = self.edge.lines.pass_(f"{self.conn.caller} bad_http")
            if held is not None:
                error = f"{type(exc).__name__}: {exc.message}"
                caller, listener = self.conn.caller, self.conn.listener
                log.info(event("bad_http", caller=caller, listener=listener, error=error, more=held))
        elif level >= logging.WARNING or exc:
            self.metrics.internal_errors.inc()
            if self.edge.lines.pass_("internal") is not None:
                log.log(level, event("http_error", message=str(msg)[:200]), exc_info=exc)
        else:
            log.log(level, event("http", message=str(msg)[:200]))


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


def _edges(
    opts: ServeOptions, tcp_hosts: frozenset[str], connection_limit: int, metrics: DaemonMetrics
) -> tuple[Edge, Edge]:
    """The API's edge (Unix socket and loopback TCP share it) and the metrics port's."""

    def closed(listener: str, why: str) -> None:
        metrics.connections_closed.labels(listener=listener, why=why).inc()

    api = Edge(
        ConnectionGate(connection_limit, opts.max_connections_per_caller, closed),
        RateLimiter(opts.max_rps, opts.max_rps),
        InFlight(opts.max_in_flight_per_caller, opts.max_in_flight),
        tcp_hosts,
        opts.body_timeout_s,
        Throttle(1.0),
    )
    probes = Edge(
        ConnectionGate(PROBE_CONNECTIONS, PROBE_CONNECTIONS_PER_CALLER, closed),
        RateLimiter(opts.max_rps, opts.max_rps),
        InFlight(PROBE_IN_FLIGHT, PROBE_IN_FLIGHT),
        frozenset(),
        opts.body_timeout_s,
        Throttle(1.0),
    )
    return api, probes


async def serve_http(
    service: ClockService,
    listeners: Listeners,
    opts: ServeOptions,
    connection_limit: int,
    lifecycle: Lifecycle,
) -> None:
    """Serve the API on the listeners until told to stop, then stop the service (its GPUs reset) and clean up."""
    api, probes = _edges(opts, listeners.tcp_hosts, connection_limit, service.metrics)
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task[None]] = []
    for sock, name in ((listeners.unix, "unix"), (listeners.tcp, "tcp"), (listeners.metrics, "metrics")):
        if sock is None:
            continue
        edge = probes if name == "metrics" else api
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

        def with_its_log(conn: Conn, edge: Edge = edge) -> None:
            conn.protocol.logger = HttpErrorLog(conn, edge, service.metrics)  # type: ignore[attr-defined]

        tasks.append(asyncio.create_task(edge.gate.accept_forever(sock, name, runner.server, with_its_log)))
    tasks.append(asyncio.create_task(service.reap_forever()))
    tasks.append(asyncio.create_task(_count_connections(service, api, probes)))
    log.info(
        event(
            "up",
            version=envpipe_version(),
            backend=service.backend.name,
            ownership=service.policy.name,
            gpus=len(service.gpu_uuids()),
            socket=opts.socket_path,
            tcp=opts.tcp,
            metrics_port=opts.metrics_port or None,
            ready=service.ready,
        )
    )
    if lifecycle.ready:
        lifecycle.ready()
    try:
        await lifecycle.stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        listeners.close()
        await service.stop()
        for runner in runners:
            await runner.cleanup()
        service.close()
        log.info(event("stopped", gpus_reset=True))


async def _count_connections(service: ClockService, api: Edge, probes: Edge) -> None:
    """The connection and in-flight gauges, once a second (a scrape may be refused when they matter most)."""
    while True:
        for edge in (api, probes):
            for listener, n in edge.gate.by_listener().items():
                service.metrics.connections.labels(listener=listener).set(n)
        service.metrics.in_flight.set(api.in_flight.count + probes.in_flight.count)
        await asyncio.sleep(1.0)

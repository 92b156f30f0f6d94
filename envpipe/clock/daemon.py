"""``envpipe-clockd``: HTTP/JSON over a Unix socket (and optionally loopback TCP) on ClockService.

Routes are thin: parse into a typed command, call the service, map ClockError to a status. The edge
(guard.py) admits connections and counts requests before any route runs.

Start-up touches no clock until the daemon owns what it needs: validate every flag, take the sockets
(refusing a live one), take the state file, open the backend; then reset what a dead daemon left,
then serve. A failure before that is one line and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import click
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from envpipe.clock.backends import make_backend
from envpipe.clock.errors import (
    BadRequest,
    BodyTooLarge,
    ClockError,
    ForeignRequest,
    RequestTimeout,
    TooManyRequests,
    UnsupportedMediaType,
)
from envpipe.clock.guard import Conn, ConnectionGate, RateLimiter, RefusalLog, connection_limit
from envpipe.clock.identity import watch_exit
from envpipe.clock.listen import Listeners, SocketInUse, StartupError, parse_tcp, take_metrics, take_tcp, take_unix
from envpipe.clock.metrics import envpipe_version
from envpipe.clock.ownership import DEFAULT_POD_RESOURCES_SOCKET, make_policy
from envpipe.clock.protocol import API, MAX_BODY_BYTES, POD_HEADER, Lock, OpenLease, Reset, pod_claim
from envpipe.clock.service import ClockService, ServiceConfig
from envpipe.clock.state import Entry, StateError, StateFile, StateUnreadable

log = logging.getLogger("envpipe.clockd")
SERVICE: web.AppKey[ClockService] = web.AppKey("service", ClockService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServeOptions:
    socket_path: str | None
    tcp: str | None  # host:port, loopback only
    metrics_port: int = 0  # 0: no separate metrics listener
    socket_mode: int = 0o660
    max_rps: float = 5000.0
    max_connections: int = 256
    socket_gid: int | None = None  # the group that may connect (the chart's socket GID); None: the daemon's own
    header_timeout_s: float = 10.0  # to send a request head; also how long an idle connection stays
    body_timeout_s: float = 10.0


@dataclass
class Edge:
    """What the middleware needs of the serving side."""

    gate: ConnectionGate
    limiter: RateLimiter
    refusals: RefusalLog
    tcp_hosts: frozenset[str]
    body_timeout_s: float


EDGE: web.AppKey[Edge] = web.AppKey("edge", Edge)


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
        claim = pod_claim(request.headers.get(POD_HEADER))
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
        exc = ClockError(http.reason)
        exc.status, exc.code = http.status, "http"
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
    claimed = pod_claim(request.headers.get(POD_HEADER))
    lease = await request.app[SERVICE].open_lease(conn.peer, cmd.pod, cmd.gpus, cmd.ttl_s, claimed)
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


# ---- serving ---------------------------------------------------------------------------------
def take_listeners(opts: ServeOptions) -> Listeners:
    listeners = Listeners()
    try:
        if opts.socket_path:
            take_unix(listeners, opts.socket_path, opts.socket_mode, opts.socket_gid)
        if opts.tcp:
            take_tcp(listeners, opts.tcp)
        if opts.metrics_port:
            take_metrics(listeners, opts.metrics_port)
    except BaseException:
        listeners.close(failed_start=True)
        raise
    return listeners


def read_state(state: StateFile | None) -> dict[str, Entry] | None:
    """What a previous daemon left, or None when every GPU must be reset (StateError: unusable file)."""
    if state is None:
        log.info("no --state-file: resetting every GPU at start")
        return None
    try:
        previous = state.open()
    except StateUnreadable as exc:
        log.error("state file unreadable (%s): resetting every GPU at start", exc)
        return None
    if previous is None:
        log.info("no state file at %s yet: resetting every GPU at start", state.path)
    return previous


async def serve(
    service: ClockService,
    listeners: Listeners,
    opts: ServeOptions,
    stop: asyncio.Event,
    previous: dict[str, Entry] | None,
    ready: Callable[[], None] | None = None,
) -> None:
    """Reset what a dead daemon left, serve until ``stop``, then reset and clean up. StartupError if the
    state file cannot be written or the descriptor limit leaves no room for connections."""
    try:
        limit = connection_limit(opts.max_connections)
        await service.start(previous)
    except (ValueError, ClockError) as exc:
        service.close()
        raise StartupError(str(exc)) from None
    gate = ConnectionGate(limit)
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


def reset_every_gpu(
    socket_path: str | None,
    socket_mode: int,
    state: StateFile | None,
    build: Callable[[StateFile | None], ClockService],
) -> dict[str, object]:
    """Reset every GPU unless a live daemon answers on the socket (it resets its own when it stops)."""
    listeners = Listeners()
    try:
        if socket_path:
            take_unix(listeners, socket_path, socket_mode)  # no daemon starts while we reset
    except SocketInUse:
        return {"reset": [], "failed": {}, "live_daemon": socket_path}
    try:
        if state is not None:
            state.open()
        service = build(state)
        asyncio.run(service.start(None, "reset-all-and-exit"))
        faults = service.faults()
        service.close()
        return {"reset": [u for u in service.gpu_uuids() if u not in faults], "failed": faults}
    finally:
        if state is not None:
            state.close()
        listeners.close()


def _guard_until_sigterm(socket_path: str | None) -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())  # before saying so: a SIGTERM right after is caught
    print(json.dumps({"guard": "waiting for SIGTERM", "socket": socket_path}), flush=True)
    while not stop.wait(1.0):
        pass


class _OneLineErrors(click.Command):
    """Every error, a bad flag included, is one line on stderr (no usage block)."""

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            sys.exit(1)


@click.command(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(envpipe_version(), prog_name="envpipe-clockd")
@click.option(
    "--socket",
    "socket_path",
    default="/run/envpipe/clockd.sock",
    show_default=True,
    help="Unix socket to serve on ('' for none).",
)
@click.option("--tcp", default=None, help="Also serve on loopback HOST:PORT (e.g. 127.0.0.1:4939).")
@click.option("--backend", type=click.Choice(["nvml", "sim", "readonly"]), default="nvml", show_default=True)
@click.option(
    "--sim-gpus",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Number of simulated GPUs (sim backend).",
)
@click.option(
    "--min-mhz",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Lowest SM clock a client may lock (allow-list).",
)
@click.option(
    "--max-mhz",
    type=click.IntRange(0),
    default=100_000,
    show_default=True,
    help="Highest SM clock a client may lock (allow-list).",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(0.5, 300),
    default=5.0,
    show_default=True,
    help="Default lease TTL in seconds (clients renew by heartbeats).",
)
@click.option("--ownership", type=click.Choice(["kubelet", "local"]), default="local", show_default=True)
@click.option("--pod-resources-socket", default=DEFAULT_POD_RESOURCES_SOCKET, show_default=True)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="TCP port on all interfaces for /metrics, /healthz and /readyz only (0: off).",
)
@click.option("--socket-mode", default="660", show_default=True, help="Octal permissions of the socket file.")
@click.option(
    "--socket-group",
    "socket_gid",
    type=click.IntRange(0, 2**31 - 1),
    default=None,
    help="Numeric group that owns the socket (the chart's socket GID; worker pods add it as a supplemental group).",
)
@click.option(
    "--max-rps",
    type=click.FloatRange(1),
    default=5000.0,
    show_default=True,
    help="Requests per second per caller (pod, process or uid) before 429.",
)
@click.option(
    "--state-file",
    default="",
    show_default=True,
    help="Where to record which GPUs are off their default clock, so a restart resets what a dead "
    "daemon left (a host path; '' keeps it in memory and resets every GPU at start).",
)
@click.option(
    "--driver-deadline",
    type=click.FloatRange(0.05, 600),
    default=3.0,
    show_default=True,
    help="Seconds a driver call may take before its GPU is marked unhealthy.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(4, 65536),
    default=256,
    show_default=True,
    help="Open client connections at most (lowered to fit the descriptor limit).",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(0.1, 3600),
    default=10.0,
    show_default=True,
    help="Seconds to send a request head; idle connections close after as long.",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(0.1, 3600),
    default=10.0,
    show_default=True,
    help="Seconds to send a request body (408 after).",
)
@click.option(
    "--reset-all-and-exit",
    is_flag=True,
    help="Reset every GPU and exit (unless a live daemon serves --socket: it resets its own GPUs when it stops).",
)
@click.option(
    "--guard",
    is_flag=True,
    help="Wait for SIGTERM, then do --reset-all-and-exit: a second container "
    "that resets GPUs at pod deletion when the daemon itself is dead.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info", show_default=True)
def main(
    socket_path: str,
    tcp: str | None,
    backend: str,
    sim_gpus: int,
    min_mhz: int,
    max_mhz: int,
    lease_ttl: float,
    ownership: str,
    pod_resources_socket: str,
    metrics_port: int,
    socket_mode: str,
    socket_gid: int | None,
    max_rps: float,
    state_file: str,
    driver_deadline: float,
    max_connections: int,
    header_timeout: float,
    body_timeout: float,
    reset_all_and_exit: bool,
    guard: bool,
    log_level: str,
) -> None:
    """The EnvPipe clock daemon: locks GPU SM clocks for unprivileged pods, by lease."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        mode = int(socket_mode, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(
            f"must be octal permissions 000-777 (e.g. 660), got {socket_mode!r}", param_hint="--socket-mode"
        )
    if tcp:
        try:
            parse_tcp(tcp)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--tcp") from None
    if not socket_path and not tcp and not (reset_all_and_exit or guard):
        raise click.UsageError("give --socket or --tcp (or both)")
    if min_mhz > max_mhz:
        raise click.BadParameter(
            f"the allow-list is empty: min {min_mhz} MHz > max {max_mhz} MHz", param_hint="--min-mhz/--max-mhz"
        )
    if reset_all_and_exit and guard:
        raise click.UsageError("give --reset-all-and-exit or --guard, not both")
    config = ServiceConfig(min_mhz, max_mhz, lease_ttl, driver_deadline_s=driver_deadline)
    state = StateFile(state_file) if state_file else None

    def build(state: StateFile | None, policy_name: str = "local") -> ClockService:
        try:
            return ClockService(
                make_backend(backend, sim_gpus), make_policy(policy_name, pod_resources_socket), config, state
            )
        except ClockError as exc:
            raise StartupError(f"cannot start with backend {backend!r}: {exc.message}") from None

    if reset_all_and_exit or guard:
        if guard:
            _guard_until_sigterm(socket_path or None)
        try:
            outcome = reset_every_gpu(socket_path or None, mode, state, build)
        except (StartupError, StateError) as exc:
            raise click.ClickException(str(exc)) from None
        print(json.dumps(outcome), flush=True)
        raise SystemExit(1 if outcome["failed"] else 0)

    opts = ServeOptions(
        socket_path or None,
        tcp,
        metrics_port,
        socket_mode=mode,
        max_rps=max_rps,
        max_connections=max_connections,
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
        socket_gid=socket_gid,
    )
    _serve_main(opts, state, lambda: build(state, ownership))


def _serve_main(opts: ServeOptions, state: StateFile | None, build: Callable[[], ClockService]) -> None:
    try:
        listeners = take_listeners(opts)
    except StartupError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        previous = read_state(state)
        service = build()
    except (StartupError, StateError) as exc:
        listeners.close(failed_start=True)
        if state is not None:
            state.close(failed_start=True)
        raise click.ClickException(str(exc)) from None

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(
            service, listeners, opts, stop, previous, ready=lambda: print(json.dumps({"ready": True}), flush=True)
        )

    failed = False
    try:
        asyncio.run(run())
    except StartupError as exc:
        failed = True
        raise click.ClickException(str(exc)) from None
    finally:
        if state is not None:
            state.close(failed_start=failed)
        listeners.close(failed_start=failed)


if __name__ == "__main__":
    main()

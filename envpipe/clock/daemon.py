"""``envpipe-clockd``: HTTP/JSON over a Unix socket (and optionally loopback TCP) on ClockService.

Routes are thin: parse into a typed command, call the service, map ClockError to a status.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import click
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from envpipe.clock.backends import make_backend
from envpipe.clock.errors import BadRequest, ClockError, TooManyRequests
from envpipe.clock.ownership import DEFAULT_POD_RESOURCES_SOCKET, Peer, make_policy, peer_of
from envpipe.clock.protocol import API, MAX_BODY_BYTES, Lock, OpenLease, Reset
from envpipe.clock.service import ClockService, ServiceConfig

log = logging.getLogger("envpipe.clockd")
SERVICE: web.AppKey[ClockService] = web.AppKey("service", ClockService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RateLimiter:
    """Token bucket per caller (pid on the Unix socket, address on TCP): floods get 429."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> bool:
        now = time.monotonic()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if len(self._buckets) > 10_000:  # forget idle callers rather than grow without bound
            self._buckets.clear()
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1, now)
        return True


def _peer(request: web.Request) -> Peer:
    transport = request.transport
    if transport is None:
        return Peer(address="gone")
    return peer_of(transport.get_extra_info("socket"), transport.get_extra_info("peername"))


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status)


def make_app(service: ClockService, max_rps: float = 5000.0) -> web.Application:
    limiter = RateLimiter(max_rps, max_rps)

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(API) and not limiter.take(_peer(request).key):
            exc: ClockError = TooManyRequests("rate limit exceeded; slow down")
            return _error(exc.status, exc.code, exc.message)
        try:
            return await handler(request)
        except ClockError as exc:
            return _error(exc.status, exc.code, exc.message)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "body_too_large", f"request bodies are limited to {MAX_BODY_BYTES} bytes")
        except web.HTTPException as exc:
            return _error(exc.status, "http", exc.reason)
        except Exception:  # never let one request take the daemon down; log it for the operator
            log.exception("internal error on %s %s", request.method, request.path)
            return _error(500, "internal", "internal error (see the daemon log)")

    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY_BYTES)
    app[SERVICE] = service
    app.router.add_routes(routes)
    return app


routes = web.RouteTableDef()


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=request.content_length)
    return await request.read()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(
        {
            "ok": True,
            "backend": svc.backend.name,
            "ownership": svc.policy.name,
            "gpus": len(svc.backend.gpus()),
            "leases": len(svc.leases),
        }
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.refresh_metrics()
    return web.Response(body=generate_latest(svc.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


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
    svc = request.app[SERVICE]
    lease = await svc.open_lease(_peer(request), cmd.pod, cmd.gpus, cmd.ttl_s)
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
    """Held open by the client for the lease's lifetime: when the connection goes away (the client
    died), the lease ends and its GPUs are reset at once instead of after the TTL."""
    svc = request.app[SERVICE]
    lease_id = request.match_info["lease"]
    svc.leases.get(lease_id)
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    try:
        while svc.leases.is_open(lease_id):
            transport = request.transport
            if transport is None or transport.is_closing():
                await svc.end_lease(lease_id, "client disconnected")
                break
            await resp.write(b".")
            await asyncio.sleep(0.1)
    except (ConnectionResetError, asyncio.CancelledError):
        await asyncio.shield(svc.end_lease(lease_id, "client disconnected"))
        raise
    return resp


# ---- serving ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServeOptions:
    socket_path: str | None
    tcp: str | None  # host:port, loopback only
    metrics_port: int  # 0: no separate metrics listener
    socket_mode: int = 0o660
    max_rps: float = 5000.0
    socket_gid: int | None = None  # the group that may connect (the chart's socket GID); None: the daemon's own


def _prepare_socket_path(path: str) -> None:
    """Refuse to start if another daemon answers on the socket; remove a stale socket file."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    if not os.path.exists(path):
        return
    if not stat.S_ISSOCK(os.stat(path).st_mode):
        raise click.ClickException(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: nobody listens
            return
    raise click.ClickException(f"another daemon is already listening on {path}")


def parse_tcp(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    try:
        if not ipaddress.ip_address(host.strip("[]")).is_loopback:
            raise click.BadParameter(f"--tcp must bind a loopback address, not {host}")
        return host.strip("[]"), int(port)
    except ValueError:
        raise click.BadParameter(
            f"--tcp takes HOST:PORT on loopback (e.g. 127.0.0.1:4939), got {value!r}"
        ) from None


async def serve(
    service: ClockService, opts: ServeOptions, stop: asyncio.Event, ready: Callable[[], None] | None = None
) -> None:
    await service.reset_all("daemon start")
    app = make_app(service, opts.max_rps)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    sites: list[web.BaseSite] = []
    if opts.socket_path:
        _prepare_socket_path(opts.socket_path)
        old = os.umask(0o177)  # the socket is never world-accessible, even for an instant
        try:
            sites.append(web.UnixSite(runner, opts.socket_path))
            await sites[-1].start()
        finally:
            os.umask(old)
        if opts.socket_gid is not None:
            os.chown(opts.socket_path, -1, opts.socket_gid)
        os.chmod(opts.socket_path, opts.socket_mode)
    if opts.tcp:
        host, port = parse_tcp(opts.tcp)
        sites.append(web.TCPSite(runner, host, port))
        await sites[-1].start()
    metrics_runner = None
    if opts.metrics_port:
        metrics_app = web.Application()
        metrics_app[SERVICE] = service
        metrics_app.router.add_get("/metrics", metrics)
        metrics_app.router.add_get("/healthz", healthz)
        metrics_runner = web.AppRunner(metrics_app, access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, "0.0.0.0", opts.metrics_port).start()
    reaper = asyncio.create_task(service.reap_forever())
    log.info(
        "envpipe-clockd up: backend=%s ownership=%s gpus=%d socket=%s tcp=%s metrics_port=%s",
        service.backend.name,
        service.policy.name,
        len(service.backend.gpus()),
        opts.socket_path,
        opts.tcp,
        opts.metrics_port or "off",
    )
    if ready:
        ready()
    try:
        await stop.wait()
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        await service.reset_all("daemon shutdown")
        await runner.cleanup()
        if metrics_runner:
            await metrics_runner.cleanup()
        if opts.socket_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(opts.socket_path)
        service.close()
        log.info("envpipe-clockd stopped; all GPUs reset")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
    help="TCP port on all interfaces for /metrics and /healthz only (0: off).",
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
    help="Requests per second per caller before 429.",
)
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning"]), default="info", show_default=True
)
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
    log_level: str,
) -> None:
    """The EnvPipe clock daemon: locks GPU SM clocks for unprivileged pods, by lease."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        mode = int(socket_mode, 8)
    except ValueError:
        raise click.BadParameter(f"--socket-mode must be octal (e.g. 660), got {socket_mode!r}") from None
    if not socket_path and not tcp:
        raise click.UsageError("give --socket or --tcp (or both)")
    if tcp:
        parse_tcp(tcp)
    try:
        service = ClockService(
            make_backend(backend, sim_gpus),
            make_policy(ownership, pod_resources_socket),
            ServiceConfig(min_mhz, max_mhz, lease_ttl),
        )
    except ClockError as exc:
        raise click.ClickException(f"cannot start with backend {backend!r}: {exc.message}") from None
    opts = ServeOptions(socket_path or None, tcp, metrics_port, mode, max_rps, socket_gid)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(service, opts, stop, ready=lambda: print(json.dumps({"ready": True}), flush=True))

    asyncio.run(run())


if __name__ == "__main__":
    main()

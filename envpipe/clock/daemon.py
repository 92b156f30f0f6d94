"""``envpipe-clockd``: the command line and the start-up of the daemon (the HTTP API is api.py).

Start-up touches no clock until the daemon owns what it needs: validate every flag, take the sockets
(refusing a live one), take the state file, open the backend; then reset what a dead daemon left,
then serve. A failure before that is one line and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from envpipe.clock.backends import make_backend
from envpipe.clock.errors import BadRequest, ClockError
from envpipe.clock.guard import connection_limit
from envpipe.clock.listen import (
    Lifecycle,
    Listeners,
    ServeOptions,
    SocketInUse,
    StartupError,
    parse_tcp,
    take_metrics,
    take_tcp,
    take_unix,
)
from envpipe.clock.logs import configure, event, log
from envpipe.clock.metrics import envpipe_version
from envpipe.clock.ownership import DEFAULT_POD_RESOURCES_SOCKET, LocalPolicy, OwnershipPolicy
from envpipe.clock.protocol import DEFAULT_SOCKET
from envpipe.clock.service import ClockService, ServiceConfig
from envpipe.clock.state import Entry, StateBusy, StateError, StateFile, StateUnreadable


def make_policy(name: str, pod_resources_socket: str) -> OwnershipPolicy:
    if name == "local":
        return LocalPolicy()
    if name == "kubelet":
        # grpc and the PodResources stubs are only needed (and imported) on Kubernetes
        from envpipe.clock.kubelet import KubeletPolicy

        return KubeletPolicy(pod_resources_socket)
    raise BadRequest(f"unknown ownership policy {name!r} (choose kubelet or local)")


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except (OSError, ValueError):  # missing, unreadable, a NUL byte
        return False


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


def process_age_s() -> float:
    """Seconds since this process started (from /proc: the kernel's count, not Python's)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime_s = float(f.read().split()[0])
    return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")


def read_state(state: StateFile | None) -> dict[str, Entry] | None:
    """What a previous daemon left, or None when every GPU must be reset (StateError: unusable file)."""
    if state is None:
        log.info(event("no_state_file", then="resetting every GPU at start"))
        return None
    try:
        previous = state.open()
    except StateUnreadable as exc:
        log.error(event("state_file_unreadable", error=str(exc), then="resetting every GPU at start"))
        return None
    if previous is None:
        log.info(event("no_state_file_yet", path=state.path, then="resetting every GPU at start"))
    return previous


async def serve(
    service: ClockService,
    listeners: Listeners,
    opts: ServeOptions,
    previous: dict[str, Entry] | None,
    lifecycle: Lifecycle,
) -> None:
    """Reset what a dead daemon left, serve until told to stop, then reset and clean up. StartupError if the
    state file cannot be written or the descriptor limit leaves no room for connections."""
    try:
        limit = connection_limit(opts.max_connections)
        await service.start(previous)
    except (ValueError, ClockError) as exc:
        service.close()
        raise StartupError(str(exc)) from None
    log.info(
        event(
            "start_up_resets_done",
            ms_since_process_start=round(process_age_s() * 1000),
            cpu_ms=round(time.process_time() * 1000),
        )
    )
    # The HTTP stack (aiohttp: a quarter of a second of imports) loads only now: GPUs a dead daemon
    # left slow are reset first.
    from envpipe.clock.api import serve_http

    await serve_http(service, listeners, opts, limit, lifecycle)


def reset_every_gpu(
    socket_path: str | None,
    socket_mode: int,
    state: StateFile,
    build: Callable[[StateFile | None], ClockService],
) -> dict[str, object]:
    """Reset every GPU, holding the daemon's own lock (the state file's): refused while a live daemon holds
    it, whatever socket that daemon serves, or answers on ``socket_path``. A live daemon resets its own GPUs
    as it stops; resetting behind its back would make its records wrong."""
    listeners = Listeners()
    try:
        try:
            state.open()  # first: while we hold it, no daemon starts on any socket
        except StateUnreadable as exc:  # held all the same: every GPU is reset below, whatever it said
            log.error(event("state_file_unreadable", error=str(exc), then="resetting every GPU"))
        if socket_path:
            take_unix(listeners, socket_path, socket_mode)  # a daemon that runs without the state file
    except (SocketInUse, StateBusy) as exc:
        state.close()
        listeners.close()
        return {"reset": [], "failed": {}, "live_daemon": str(exc)}
    except BaseException:
        state.close(failed_start=True)
        listeners.close(failed_start=True)
        raise
    try:
        service = build(state)
        asyncio.run(service.start(None, "reset-all-and-exit"))
        faults = service.faults()
        service.close()
        return {"reset": [u for u in service.gpu_uuids() if u not in faults], "failed": faults}
    finally:
        state.close()
        listeners.close()


def _guard_until_sigterm(socket_path: str | None) -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())  # before saying so: a SIGTERM right after is caught
    print(json.dumps({"guard": "waiting for SIGTERM", "socket": socket_path}), flush=True)
    while not stop.wait(1.0):
        pass


class Seconds(click.FloatRange):
    """A finite number in a range: click's FloatRange lets nan through (every comparison with it is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


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
    default=DEFAULT_SOCKET,
    show_default=True,
    help="Unix socket to serve on ('' for none).",
)
@click.option("--tcp", default=None, help="Also serve on loopback HOST:PORT (e.g. 127.0.0.1:4939).")
@click.option("--backend", type=click.Choice(["nvml", "sim", "readonly"]), default="nvml", show_default=True,
              help="nvml: real GPUs, clocks set through NVML; sim: simulated GPUs (CPU machines, tests); readonly: "
              "real NVML reads, clock changes recorded but never applied.")
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
    type=Seconds(0.5, 300),
    default=5.0,
    show_default=True,
    help="Default lease TTL in seconds (clients renew by heartbeats).",
)
@click.option("--ownership", type=click.Choice(["kubelet", "local"]), default="kubelet", show_default=True,
              help="Who may lock a GPU. kubelet: only the pod the kubelet assigned it to (its PodResources API; "
              "the chart's setting); local: any caller that can open the socket (one machine off Kubernetes).")
@click.option("--pod-resources-socket", default=DEFAULT_POD_RESOURCES_SOCKET, show_default=True,
              help="The kubelet's PodResources socket (--ownership kubelet).")
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
    type=Seconds(1, 1e6),
    default=5000.0,
    show_default=True,
    help="Requests per second per caller (lease, pod, process or uid) before 429.",
)
@click.option(
    "--state-file",
    default="",
    show_default=True,
    help="Where to record which GPUs are off their default clock, so a restart resets what a dead "
    "daemon left (a host path); its lock keeps a second daemon off the node's GPUs. Required with --backend "
    "nvml; '' (sim, readonly) keeps it in memory and resets every GPU at start.",
)
@click.option(
    "--driver-deadline",
    type=Seconds(0.05, 600),
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
    "--max-connections-per-caller",
    type=click.IntRange(1, 65536),
    default=32,
    show_default=True,
    help="Open connections of one caller at most; its idle ones make room for its new ones.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(1, 65536),
    default=128,
    show_default=True,
    help="Requests served at once, in all (429 above).",
)
@click.option(
    "--max-in-flight-per-caller",
    type=click.IntRange(1, 65536),
    default=16,
    show_default=True,
    help="Requests of one caller served at once (429 above).",
)
@click.option(
    "--header-timeout",
    type=Seconds(0.1, 3600),
    default=10.0,
    show_default=True,
    help="Seconds to send a request head; idle connections close after as long.",
)
@click.option(
    "--body-timeout",
    type=Seconds(0.1, 3600),
    default=10.0,
    show_default=True,
    help="Seconds to send a request body (408 after).",
)
@click.option(
    "--reset-all-and-exit",
    is_flag=True,
    help="Reset every GPU and exit, holding the daemon's lock (--state-file, required): refused while a live "
    "daemon holds it or serves --socket (it resets its own GPUs when it stops).",
)
@click.option(
    "--guard",
    is_flag=True,
    help="Wait for SIGTERM, then do --reset-all-and-exit: a second container "
    "that resets GPUs at pod deletion when the daemon itself is dead.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info", show_default=True,
              help="Least level logged (the audit lines of clock changes are info).")
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
    max_connections_per_caller: int,
    max_in_flight: int,
    max_in_flight_per_caller: int,
    header_timeout: float,
    body_timeout: float,
    reset_all_and_exit: bool,
    guard: bool,
    log_level: str,
) -> None:
    """The EnvPipe clock daemon: locks GPU SM clocks for unprivileged pods, by lease."""
    configure(log_level)
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
    if backend == "nvml" and not state_file:
        raise click.UsageError(
            "--backend nvml needs --state-file: its lock is how a second daemon on this node, on any socket, is "
            "refused before it resets the GPUs a live one leased (the chart passes one)"
        )
    if (reset_all_and_exit or guard) and not state_file:
        flag = "--guard" if guard else "--reset-all-and-exit"
        raise click.UsageError(
            f"{flag} needs --state-file: it resets only while holding the daemon's lock on it, so that it never "
            "resets a live daemon's GPUs"
        )
    serving = not (reset_all_and_exit or guard)
    if serving and ownership == "kubelet" and not _is_socket(pod_resources_socket):
        raise click.UsageError(
            f"--ownership kubelet (the default) asks the kubelet which pod owns a GPU, and there is no kubelet "
            f"socket at {pod_resources_socket}: on a machine without Kubernetes give --ownership local (any caller "
            "that can open the daemon's socket may then lock any GPU), or --pod-resources-socket"
        )
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
        assert state is not None  # checked above
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
        max_connections_per_caller=max_connections_per_caller,
        max_in_flight=max_in_flight,
        max_in_flight_per_caller=max_in_flight_per_caller,
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
            service, listeners, opts, previous, Lifecycle(stop, lambda: print(json.dumps({"ready": True}), flush=True))
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

"""The daemon's listeners: what to serve on and with which limits, and taking the sockets before any
GPU is touched.

Every failure is one StartupError line that names the flag and the path, and leaves nothing behind:
directories made here are removed again, and an existing socket file is only removed when it is
provably stale (connect() refused: zeusd's rule), never when it is live or cannot be told apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import ipaddress
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

SUN_PATH_MAX = 107  # bytes of a Unix socket path (sun_path is 108 with its NUL)


@dataclass(frozen=True)
class ServeOptions:
    socket_path: str | None
    tcp: str | None  # host:port, loopback only
    metrics_port: int = 0  # 0: no separate metrics listener
    socket_mode: int = 0o660
    max_rps: float = 5000.0  # per caller (ratelimit.py)
    max_connections: int = 256
    max_connections_per_caller: int = 32
    max_in_flight: int = 128
    max_in_flight_per_caller: int = 16
    socket_gid: int | None = None  # the group that may connect (the chart's socket GID); None: the daemon's own
    header_timeout_s: float = 10.0  # to send a request head; also how long an idle connection stays
    body_timeout_s: float = 10.0


@dataclass(frozen=True)
class Lifecycle:
    """How long the daemon serves: until ``stop`` is set; ``ready`` is called once it serves."""

    stop: asyncio.Event
    ready: Callable[[], None] | None = None


class StartupError(Exception):
    """The daemon cannot start; the message is the one line the operator sees."""


class SocketInUse(StartupError):
    """A live daemon answers on the socket."""


def parse_tcp(value: str) -> tuple[str, int]:
    """``HOST:PORT`` on loopback; ValueError with the reason otherwise."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
        number = int(port)
    except ValueError:
        raise ValueError(f"takes HOST:PORT on loopback (e.g. 127.0.0.1:4939), got {value!r}") from None
    if not loopback:
        raise ValueError(f"must bind a loopback address, not {host}")
    if not 1 <= number <= 65535:
        raise ValueError(f"port {number} is outside 1-65535")
    return host, number


@dataclass
class Listeners:
    unix: socket.socket | None = None
    unix_path: str | None = None
    tcp: socket.socket | None = None
    tcp_hosts: frozenset[str] = frozenset()  # the Host headers the TCP listener answers
    metrics: socket.socket | None = None
    made_dirs: list[str] = field(default_factory=list)

    def close(self, *, failed_start: bool = False) -> None:
        for sock in (self.unix, self.tcp, self.metrics):
            if sock is not None:
                sock.close()
        if self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_path)
        if failed_start:
            for d in reversed(self.made_dirs):
                with contextlib.suppress(OSError):
                    os.rmdir(d)


def _make_parents(path: str, made: list[str]) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    missing, d = [], parent
    while not os.path.lexists(d):
        missing.append(d)
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        raise StartupError(f"--socket {path}: {d} is not a directory")
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except OSError as exc:
            raise StartupError(f"--socket {path}: cannot create {d}: {exc.strerror}") from None
        made.append(d)
    return parent


def _clear_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"--socket {path}: exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # nobody listens: a dead daemon's socket
            return
        except (TimeoutError, BlockingIOError):
            pass  # a listener whose backlog is full: live
        except OSError as exc:
            raise StartupError(
                f"--socket {path}: cannot tell whether a daemon listens on it ({exc.strerror}); remove it by hand"
            ) from None
    raise SocketInUse(f"--socket {path}: another daemon is already listening on it")


def take_unix(listeners: Listeners, path: str, mode: int, gid: int | None = None) -> None:
    """Bind ``path`` with ``mode``, owned by group ``gid`` (the training pods' group) if given."""
    size = len(os.fsencode(path))
    if size > SUN_PATH_MAX:
        raise StartupError(f"--socket {path}: too long for a Unix socket ({size} bytes; at most {SUN_PATH_MAX})")
    parent = _make_parents(path, listeners.made_dirs)
    dir_fd = os.open(parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)  # two daemons starting at once take turns
        _clear_stale(path)
        sock = socket.socket(socket.AF_UNIX)
        old = os.umask(0o177)  # the socket is never world-accessible, even for an instant
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            raise StartupError(f"--socket {path}: cannot bind: {exc.strerror}") from None
        finally:
            os.umask(old)
        listeners.unix, listeners.unix_path = sock, path
        try:
            if gid is not None:
                os.chown(path, -1, gid)
            os.chmod(path, mode)
        except OSError as exc:
            raise StartupError(f"--socket {path}: cannot set its group or mode: {exc.strerror}") from None
        sock.listen(1024)
    finally:
        os.close(dir_fd)


def _take_tcp(flag: str, host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        reason = "address in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise StartupError(f"{flag} {host}:{port}: cannot listen: {reason}") from None
    return sock


def take_tcp(listeners: Listeners, value: str) -> None:
    host, port = parse_tcp(value)
    listeners.tcp = _take_tcp("--tcp", host, port)
    shown = f"[{host}]" if ":" in host else host
    listeners.tcp_hosts = frozenset({f"{shown}:{port}", f"localhost:{port}"})


def take_metrics(listeners: Listeners, port: int) -> None:
    listeners.metrics = _take_tcp("--metrics-port", "0.0.0.0", port)

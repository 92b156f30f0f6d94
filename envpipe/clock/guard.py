"""The daemon's edge: who may connect, how many, how fast, and one log line per refusal.

aiohttp parses HTTP; this module decides before it does. Connections are accepted here, the peer is
identified once (identity.peer_of), and the connection is handed to aiohttp only while the count is
under the limit. At the limit, the longest-idle connection that is not serving a request is closed to
make room (a half-sent request head first: what a slow-loris attack holds), and only when every
connection is busy is the newcomer refused. The limit is kept under the process's descriptor limit,
and running out of descriptors anyway costs one log line a second, not a traceback per accept.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from envpipe.clock.identity import Peer, peer_of

log = logging.getLogger("envpipe.clockd")
RESERVED_FDS = 32  # above those open at start: NVML, the kubelet channel, the state file, logs


class RateLimiter:
    """Token bucket per caller key (identity.Peer.rate_key): floods get 429."""

    MAX_KEYS = 10_000

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def take(self, key: str) -> bool:
        now = time.monotonic()
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if len(self._buckets) >= self.MAX_KEYS:  # forget the longest-quiet caller, not everyone
            self._buckets.popitem(last=False)
        ok = tokens >= 1
        self._buckets[key] = (tokens - 1 if ok else tokens, now)
        return ok


@dataclass
class Conn:
    peer: Peer
    listener: str  # "unix", "tcp" or "metrics"
    protocol: asyncio.BaseProtocol
    busy: int = 0  # requests being served (an attach stream is one for its whole life)
    served: int = 0  # requests whose head arrived
    last_active: float = field(default_factory=time.monotonic)
    connected: bool = False  # handed to aiohttp; until then it has no transport yet

    @property
    def transport(self) -> asyncio.BaseTransport | None:
        return getattr(self.protocol, "transport", None)  # None before it connects and after it closed

    def open(self) -> bool:
        return not self.connected or (self.transport is not None and not self.transport.is_closing())


def connection_limit(wanted: int) -> int:
    """``wanted``, or fewer if the descriptor limit cannot hold that many connections."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 16
    room = soft - open_now - RESERVED_FDS
    if room < 4:
        raise ValueError(f"the descriptor limit ({soft}) leaves room for {max(room, 0)} connections; raise ulimit -n")
    if room < wanted:
        log.warning("--max-connections %d lowered to %d to stay under the descriptor limit %d", wanted, room, soft)
    return min(wanted, room)


class ConnectionGate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._conns: dict[asyncio.BaseProtocol, Conn] = {}
        self._quiet_until = 0.0  # one "refused/out of descriptors" line a second

    def conn(self, protocol: asyncio.BaseProtocol) -> Conn:
        """The connection a request came on (every one was accepted here)."""
        return self._conns[protocol]

    def count(self) -> int:
        self._prune()
        return len(self._conns)

    def _prune(self) -> None:
        for p in [p for p, c in self._conns.items() if not c.open()]:
            del self._conns[p]

    def _make_room(self) -> bool:
        self._prune()
        if len(self._conns) < self.limit:
            return True
        idle = [c for c in self._conns.values() if c.busy == 0 and c.connected]
        if not idle:
            return False
        victim = min(idle, key=lambda c: (c.served > 0, c.last_active))  # never-used first, then oldest
        assert victim.transport is not None  # pruned otherwise
        victim.transport.close()
        self._prune()
        return True

    def _say(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + 1.0
            log.warning(message, *args)

    async def accept_forever(
        self, sock: socket.socket, listener: str, protocol_factory: Callable[[], asyncio.Protocol]
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                self._say("accepting on %s: %s; waiting for descriptors", listener, exc.strerror)
                await asyncio.sleep(0.1)
                continue
            try:
                peer = peer_of(client)
            except OSError:  # gone before we looked
                client.close()
                continue
            if not self._make_room():
                self._say(
                    "refused a connection from %s on %s: all %d connections are busy",
                    peer.describe(),
                    listener,
                    self.limit,
                )
                client.close()
                continue
            await self._hand_over(client, Conn(peer, listener, protocol_factory()))

    async def _hand_over(self, client: socket.socket, conn: Conn) -> None:
        self._conns[conn.protocol] = conn  # before its first request can arrive
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: conn.protocol, client)
        except OSError:
            del self._conns[conn.protocol]
            client.close()
            return
        conn.connected = True

    def begin(self, conn: Conn) -> None:
        conn.busy += 1
        conn.served += 1
        conn.last_active = time.monotonic()

    def end(self, conn: Conn) -> None:
        conn.busy -= 1
        conn.last_active = time.monotonic()


class RefusalLog:
    """One line per refused request; a flood of 429s from one caller is one line a second, with the
    number of refusals it stands for."""

    def __init__(self) -> None:
        self._floods: dict[str, tuple[float, int]] = {}

    def refused(self, status: int, code: str, what: str, key: str, message: str) -> None:
        """``key`` (the caller's rate-limit key) names the caller: its proven pod, its pid, the pod it
        claims when hidden, or its uid."""
        if status == 429:
            now = time.monotonic()
            since, count = self._floods.get(key, (0.0, 0))
            if now - since < 1.0:
                self._floods[key] = (since, count + 1)
                return
            self._floods[key] = (now, 0)
            if len(self._floods) > RateLimiter.MAX_KEYS:
                self._floods.clear()
            if count:
                message += f" ({count} more refused in the second before)"
        level = logging.WARNING if status >= 500 else logging.INFO
        log.log(level, "refused %d %s %s from %s: %s", status, code, what, key, message)

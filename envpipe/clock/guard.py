"""The daemon's door: who may connect, how many, and whose connection goes when there is no room.

aiohttp parses HTTP; this module decides before it does. Connections are accepted here, the peer is
identified once (identity.peer_of), and the connection is handed to aiohttp only while there is room.
Connections are counted per caller (``Conn.caller``): the lease the connection has served, once it served
one (the lease id is a secret: nobody else can be counted there), else the peer as the kernel names it.
A caller at its own limit makes room among its own connections; at the total limit, room is made among
the connections of the caller that holds the most. Only a connection doing no work for the daemon is
closed (idle, or a request head or body still arriving: what a slow-loris attack holds), the longest quiet
first; never one whose request the daemon is serving, nor an attach stream. With none to close, the
newcomer is refused. So a flood of connections costs the caller that floods its own older connections, and
a newcomer of another caller sharing its identity (pods of one uid, pids hidden), about to send its first
request, is neither refused nor the one closed. Connections are accepted in batches, so that a flood of
them drains the listen backlog fast and other callers' connections are not left waiting in it.
The limit is kept under the process's descriptor limit, and running out of descriptors anyway costs one
log line a second, not a traceback per accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from envpipe.clock.identity import Peer, peer_of
from envpipe.clock.logs import Throttle, event, log

RESERVED_FDS = 32  # above those open at start: NVML, the kubelet channel, the state file, logs
ACCEPT_BATCH = 64  # connections accepted in one go before the loop serves anything else


@dataclass
class Conn:
    peer: Peer
    listener: str  # "unix", "tcp" or "metrics"
    protocol: asyncio.BaseProtocol
    working: int = 0  # requests the daemon is serving (admitted past their body; an attach for its whole life)
    served: int = 0  # requests whose head arrived
    last_active: float = field(default_factory=time.monotonic)
    connected: bool = False  # handed to aiohttp; until then it has no transport yet
    lease_key: str | None = None  # the lease whose requests this connection carried ("lease:<prefix>")

    @property
    def caller(self) -> str:
        return self.lease_key or self.peer.key

    @property
    def transport(self) -> asyncio.BaseTransport | None:
        return getattr(self.protocol, "transport", None)  # None before it connects and after it closed

    def open(self) -> bool:
        return not self.connected or (self.transport is not None and not self.transport.is_closing())

    def closable(self) -> bool:
        """Doing no work for the daemon: closing it loses nothing its client cannot send again."""
        return self.connected and self.working == 0


def connection_limit(wanted: int) -> int:
    """``wanted``, or fewer if the descriptor limit cannot hold that many connections."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 16
    room = soft - open_now - RESERVED_FDS
    if room < 4:
        raise ValueError(f"the descriptor limit ({soft}) leaves room for {max(room, 0)} connections; raise ulimit -n")
    if room < wanted:
        log.warning(event("max_connections_lowered", wanted=wanted, to=room, descriptor_limit=soft))
    return min(wanted, room)


class ConnectionGate:
    def __init__(self, limit: int, per_caller: int, on_close: Callable[[str, str], None] | None = None) -> None:
        """``on_close(listener, why)`` hears of each connection the gate closes: "refused" or "made_room"."""
        self.limit, self.per_caller = limit, min(per_caller, limit)
        self.on_close = on_close
        self._conns: dict[asyncio.BaseProtocol, Conn] = {}
        self._listeners: set[str] = set()
        self._say = Throttle(1.0)  # "refused" and "out of descriptors": one line a second

    def conn(self, protocol: asyncio.BaseProtocol) -> Conn | None:
        """The connection a request came on; None once it was closed (a request it had sent may still
        reach a handler: nobody is left to answer)."""
        return self._conns.get(protocol)

    def count(self) -> int:
        self._prune()
        return len(self._conns)

    def by_listener(self) -> dict[str, int]:
        """Open connections per listener (every listener this gate serves, 0 included)."""
        self._prune()
        counts = dict.fromkeys(self._listeners, 0)
        for c in self._conns.values():
            counts[c.listener] += 1
        return counts

    def _prune(self) -> None:
        for p in [p for p, c in self._conns.items() if not c.open()]:
            del self._conns[p]

    def _close_one(self, caller: str) -> bool:
        """Close ``caller``'s connection that matters least: the longest quiet (since it connected or its last
        request head arrived). Not the newest unused one: with pids hidden a newcomer of another pod of the same
        uid is that, about to send its first request, while the abuser's slow bodies are older."""
        closable = [c for c in self._conns.values() if c.caller == caller and c.closable()]
        if not closable:
            return False
        victim = min(closable, key=lambda c: c.last_active)
        assert victim.transport is not None  # pruned otherwise
        victim.transport.close()  # is_closing() from now on: pruned
        if self.on_close is not None:
            self.on_close(victim.listener, "made_room")
        return True

    def _make_room(self, caller: str) -> bool:
        self._prune()
        held = Counter(c.caller for c in self._conns.values())
        if held[caller] >= self.per_caller:
            return self._close_one(caller)
        if len(self._conns) < self.limit:
            return True
        return any(self._close_one(other) for other, _ in held.most_common())

    def _warn(self, key: str, name: str, **fields: object) -> None:
        held = self._say.pass_(key)
        if held is not None:
            log.warning(event(name, **fields, more=held))

    async def accept_forever(
        self,
        sock: socket.socket,
        listener: str,
        protocol_factory: Callable[[], asyncio.Protocol],
        configure: Callable[[Conn], None] | None = None,
    ) -> None:
        """Accept on ``sock`` for ever; ``configure`` sees each connection before it is served."""
        loop = asyncio.get_running_loop()
        self._listeners.add(listener)
        while True:
            try:
                first = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                self._warn("descriptors", "accept_failed", listener=listener, error=exc.strerror)
                await asyncio.sleep(0.1)
                continue
            batch = [first[0]]
            with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
                while len(batch) < ACCEPT_BATCH:  # what else waits in the backlog, without a round trip each
                    batch.append(sock.accept()[0])
            for client in batch:
                await self._admit(client, listener, protocol_factory, configure)

    async def _admit(
        self,
        client: socket.socket,
        listener: str,
        protocol_factory: Callable[[], asyncio.Protocol],
        configure: Callable[[Conn], None] | None,
    ) -> None:
        try:
            peer = peer_of(client)
        except OSError:  # gone before we looked
            client.close()
            return
        if not self._make_room(peer.key):
            self._warn(
                f"refused {peer.key}", "connection_refused", caller=peer.key, listener=listener, limit=self.limit,
                per_caller=self.per_caller,
            )
            client.close()
            if self.on_close is not None:
                self.on_close(listener, "refused")
            return
        client.setblocking(False)
        conn = Conn(peer, listener, protocol_factory())
        if configure is not None:
            configure(conn)
        await self._hand_over(client, conn)

    async def _hand_over(self, client: socket.socket, conn: Conn) -> None:
        self._conns[conn.protocol] = conn  # before its first request can arrive
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: conn.protocol, client)
        except OSError:
            self._conns.pop(conn.protocol, None)
            client.close()
            return
        conn.connected = True

    def begin(self, conn: Conn) -> None:
        conn.served += 1
        conn.last_active = time.monotonic()

    def end(self, conn: Conn) -> None:
        conn.last_active = time.monotonic()

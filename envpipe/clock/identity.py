"""Who is on the other end of a connection, and how much of it is proven.

``SO_PEERCRED`` gives the peer's pid, uid and gid as the kernel recorded them at ``connect()``,
translated into the daemon's namespaces. Where the daemon shares the peer's PID namespace (off
Kubernetes, or a pod with ``hostPID``) the pid is real, and ``/proc/<pid>/cgroup`` names the cgroup the
kubelet and the container runtime put the peer in; its path carries the pod UID and the container ID.
A process cannot move itself out of its pod's cgroup, so that pod UID is proven. In its own PID
namespace (the chart's default) the kernel reports pid 0: the peer is hidden, and only its uid and
what it claims (the pod it names) are known. ``describe()`` says which, in every audit line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

# kubepods-burstable-pod<uid with _>.slice (systemd driver) or .../pod<uid>/ (cgroupfs driver)
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# the last path element: <64 hex>, cri-containerd-<64 hex>.scope, crio-<64 hex>.scope, docker-<64 hex>.scope
_CONTAINER = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class Peer:
    pid: int | None = None  # None: hidden in another PID namespace, or a TCP peer
    uid: int | None = None
    gid: int | None = None
    address: str | None = None  # TCP peers only
    pod_uid: str | None = None  # from the peer's cgroup: proven
    container: str | None = None
    start_ticks: int | None = None  # the process's start time: a reused pid has another

    def describe(self) -> str:
        if self.address is not None:
            return f"tcp={self.address}"
        pid = "hidden" if self.pid is None else str(self.pid)
        text = f"pid={pid} uid={self.uid} gid={self.gid}"
        if self.pod_uid:
            text += f" pod_uid={self.pod_uid}"
        if self.container:
            text += f" container={self.container[:12]}"
        return text

    @property
    def key(self) -> str:
        """Who the kernel says the caller is, as the edge counts callers: the proven pod where known, else
        the process, else (hidden in another PID namespace) the uid. Never what the caller claims: a
        claim costs nothing to change, so it cannot keep floods apart (requests that name a lease are
        counted per lease instead: ratelimit.py)."""
        if self.address is not None:
            return f"tcp:{self.address}"
        if self.pod_uid:
            return f"pod-uid:{self.pod_uid}"
        if self.pid is not None:
            return f"pid:{self.pid}"
        return f"uid:{self.uid}"


def pod_of_cgroup(text: str) -> tuple[str, str | None] | None:
    """(pod UID, container ID or None) from a /proc/<pid>/cgroup text; None outside a pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        pod = _POD.search(path)
        if pod:
            container = _CONTAINER.search(path)
            return pod.group(1).replace("_", "-"), container.group(1) if container else None
    return None


def _start_ticks(pid: int, proc_root: str) -> int | None:
    try:
        with open(f"{proc_root}/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the (comm)
    except (OSError, ValueError, IndexError):
        return None


def resolve(pid: int, uid: int, gid: int, proc_root: str = "/proc") -> Peer:
    """The peer of SO_PEERCRED ``(pid, uid, gid)``, with its pod where its cgroup is readable."""
    if pid == 0:
        return Peer(uid=uid, gid=gid)
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            found = pod_of_cgroup(f.read())
    except OSError:  # exited already, or /proc is not ours
        found = None
    pod_uid, container = found if found else (None, None)
    return Peer(pid, uid, gid, pod_uid=pod_uid, container=container, start_ticks=_start_ticks(pid, proc_root))


class _RecentPeers:
    """Peers resolved in the last second, by their credentials: a process that opens thousands of
    connections costs the daemon one read of its /proc files a second, not two per connection. A pid
    reused by another process within that second would be taken for the old one for the rest of it;
    watch_exit checks the start time again before it trusts a pid."""

    TTL_S, MAX = 1.0, 4096

    def __init__(self) -> None:
        self._peers: dict[tuple[int, int, int], tuple[float, Peer]] = {}

    def resolve(self, pid: int, uid: int, gid: int) -> Peer:
        now = time.monotonic()
        known = self._peers.get((pid, uid, gid))
        if known is not None and known[0] > now:
            return known[1]
        if len(self._peers) >= self.MAX:
            self._peers.clear()
        peer = resolve(pid, uid, gid)
        self._peers[(pid, uid, gid)] = (now + self.TTL_S, peer)
        return peer


_recent = _RecentPeers()


def peer_of(sock: socket.socket) -> Peer:
    if sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return _recent.resolve(*struct.unpack("3i", raw))
    return Peer(address=str(sock.getpeername()[0]))


def watch_exit(peer: Peer, on_exit: Callable[[], None]) -> Callable[[], None] | None:
    """Call ``on_exit`` on the event loop when the peer's process exits, whatever its children hold;
    returns the cancel function, or None when the peer cannot be watched (hidden, gone, pid reused)."""
    if peer.pid is None:
        return None
    try:
        fd = os.pidfd_open(peer.pid)
    except OSError:
        return None
    if _start_ticks(peer.pid, "/proc") != peer.start_ticks:  # the pid is another process's now
        os.close(fd)
        return None
    loop = asyncio.get_running_loop()
    done = False

    def cancel() -> None:
        nonlocal done
        if not done:
            done = True
            loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def fire() -> None:
        cancel()
        on_exit()

    loop.add_reader(fd, fire)
    return cancel

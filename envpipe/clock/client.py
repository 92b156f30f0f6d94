"""Client of envpipe-clockd for the training runtime.

A background thread runs an asyncio loop that holds the lease: it heartbeats, keeps the ``attach``
connection open (so the daemon resets the GPUs if this process dies), and applies ``set`` requests
(the latest request per GPU wins) without ever blocking the training thread.

When the lease is lost (the daemon restarted, or ended the lease), the client says so once, opens a new
lease as soon as a daemon answers, and locks each GPU again at the clock last asked for. How long it ran
without a lease (``uncontrolled_s()``) and how often it came back (``reattaches``) are there for the run's
summary: its GPUs ran at default clocks meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from typing import Any

import aiohttp

from envpipe.clock.protocol import (
    ATTACH,
    DEFAULT_SOCKET,
    GPU,
    GPUS,
    LEASE,
    LEASES,
    LOCK,
    POD_HEADER,
    RENEW,
    SOCKET_ENV,
    path,
)

__all__ = ["DEFAULT_SOCKET", "SOCKET_ENV", "ClockClient", "ClockDaemonUnavailable", "ClockRequestError", "list_gpus"]

# Below the daemon's --header-timeout (it closes idle connections): never reuse one it is closing.
KEEPALIVE_S = 2.0
REATTACH_PAUSE_S = (0.05, 2.0)  # first and longest pause between tries to open a new lease
# Pauses before each try of one request whose connection failed before an answer came: under a flood of
# connections the daemon's listen backlog can be full for a moment (and asyncio reports that late, as a
# write to a socket that never connected), or the daemon closed the idle connection as the request left.
RETRY_PAUSES_S = (0.0, 0.05, 0.2, 0.5)
log = logging.getLogger("envpipe.clock.client")
_attach_fds: set[int] = set()  # this process's attach connections


def _drop_attach_fds_in_child() -> None:
    """A forked child (a DataLoader worker) inherits the attach connections; if it kept them, the
    daemon would see the lease alive after the trainer died. Point the child's copies at /dev/null:
    the connection closes for the child, and the descriptor numbers stay valid for whatever still
    refers to them."""
    if not _attach_fds:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in _attach_fds:
        with contextlib.suppress(OSError):
            os.dup2(null, fd)
    os.close(null)
    _attach_fds.clear()


os.register_at_fork(after_in_child=_drop_attach_fds_in_child)


class ClockDaemonUnavailable(RuntimeError):
    """No daemon answers on the socket: the runtime runs at default clocks (and says so)."""


class ClockRequestError(RuntimeError):
    """The daemon refused a request (status and message from the daemon)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"clockd {status} {body.get('error')}: {body.get('message')}")
        self.status, self.body = status, body

    @property
    def lease_gone(self) -> bool:
        return self.status == 404 and self.body.get("error") == "unknown_lease"


def _unreachable(socket_path: str, exc: BaseException) -> ClockDaemonUnavailable:
    """One line: the socket and the OS's reason (aiohttp's own text names TLS settings that do not apply)."""
    why = getattr(exc, "os_error", None) or exc
    reason = getattr(why, "strerror", None) or str(why) or type(why).__name__
    return ClockDaemonUnavailable(f"envpipe-clockd does not answer on {socket_path}: {reason}")


def _socket(socket_path: str | None) -> str:
    return socket_path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


async def _send(session: aiohttp.ClientSession, socket_path: str, method: str, where: str, json: Any = None) -> Any:
    """One request, tried again on a new connection when the connection failed before an answer came
    (RETRY_PAUSES_S). Every request of the API is safe to repeat: locks, resets, renewals and reads are
    idempotent, and a lease opened twice makes the second try a 409, which the caller tries again."""
    failure: aiohttp.ClientConnectionError | None = None
    for pause in RETRY_PAUSES_S:
        await asyncio.sleep(pause)
        try:
            async with session.request(method, "http://clockd" + where, json=json) as resp:
                body = await resp.json(content_type=None)
            break
        except aiohttp.ClientConnectionError as exc:
            failure = exc
    else:
        assert failure is not None
        raise _unreachable(socket_path, failure) from failure
    if resp.status >= 400:
        raise ClockRequestError(resp.status, body if isinstance(body, dict) else {"message": str(body)})
    return body


def list_gpus(socket_path: str | None = None, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The daemon's GPUs (``GET /v1/gpus``) without opening a lease."""
    where = _socket(socket_path)
    if not os.path.exists(where):
        raise ClockDaemonUnavailable(f"no envpipe-clockd socket at {where} (set {SOCKET_ENV})")

    async def get() -> list[dict[str, Any]]:
        connector = aiohttp.UnixConnector(path=where)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            try:
                body = await _send(s, where, "GET", GPUS)
            except TimeoutError as exc:
                raise _unreachable(where, exc) from exc
        return list(body["gpus"])

    return asyncio.run(get())


class ClockClient:
    def __init__(
        self,
        socket_path: str | None = None,
        *,
        gpu_uuids: list[str],
        ttl_s: float = 5.0,
        pod: dict[str, str] | None = None,
        connect_timeout_s: float = 2.0,
    ) -> None:
        self.socket_path = _socket(socket_path)
        self.ttl_s = ttl_s
        self.gpu_uuids = list(gpu_uuids)
        if pod is None and os.environ.get("POD_NAME") and os.environ.get("POD_NAMESPACE"):
            pod = {"namespace": os.environ["POD_NAMESPACE"], "name": os.environ["POD_NAME"]}
        self.pod = pod
        self.last_error: Exception | None = None  # the latest failed set() or heartbeat
        self.refused: list[tuple[int, ClockRequestError]] = []  # every refused set(): (MHz, the daemon's answer)
        self.applied: dict[str, int] = {}  # gpu uuid -> clock the daemon applied last
        self.lease: str | None = None  # None while the client holds no lease (lost, not yet back)
        self.reattaches = 0  # new leases opened after one was lost
        self._wanted: dict[str, int] = {}  # the clock last asked for, per GPU: locked again after a re-attach
        self._pending: dict[str, int] = {}
        self._busy = False  # a lock request is in flight
        self._control = threading.Lock()  # guards the two below: read from the training thread
        self._lost_at: float | None = None  # since when the client holds no lease
        self._uncontrolled = 0.0  # seconds without a lease, spans that ended
        self._held: list[asyncio.Task[None]] = []  # the lease's heartbeat and attach
        self._reattaching: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="envpipe-clock-client", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._run(self._start(), connect_timeout_s + 5)
        except BaseException:
            self._stop_loop()
            raise

    # ---- what the run's summary reads -----------------------------------------------------------
    def uncontrolled_s(self) -> float:
        """Seconds this client held no lease since it was made (its GPUs at default clocks meanwhile): the
        spans between losing a lease and the clocks being locked again, the current one included."""
        with self._control:
            ongoing = 0.0 if self._lost_at is None else time.monotonic() - self._lost_at
            return self._uncontrolled + ongoing

    @property
    def controlled(self) -> bool:
        """A lease is held and the clocks asked for are applied (or being applied)."""
        with self._control:
            return self._lost_at is None

    # ---- the loop thread ----------------------------------------------------------------------
    def _run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _request(self, method: str, where: str, json: Any = None) -> Any:
        return await _send(self._session, self.socket_path, method, where, json)

    async def _start(self) -> None:
        if not os.path.exists(self.socket_path):
            raise ClockDaemonUnavailable(f"no envpipe-clockd socket at {self.socket_path} (set {SOCKET_ENV})")
        pod = self.pod
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.socket_path, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=10),
            # who we say we are on every request: the daemon's audit lines name the pod
            headers={POD_HEADER: f"{pod['namespace']}/{pod['name']}"} if pod else None,
        )
        self._wake = asyncio.Event()
        try:
            await self._open_lease()
        except BaseException:
            await self._session.close()
            raise
        self._apply_task = asyncio.create_task(self._apply())

    async def _open_lease(self) -> None:
        body: dict[str, Any] = {"gpus": self.gpu_uuids, "ttl_s": self.ttl_s}
        if self.pod is not None:
            body["pod"] = self.pod
        reply = await self._request("POST", LEASES, body)
        lease: str = reply["lease"]
        self.lease = lease
        self._held = [asyncio.create_task(self._heartbeat(lease)), asyncio.create_task(self._attach(lease))]

    def _lose(self, lease: str, why: str) -> None:
        """The lease is gone (or its daemon is): stop holding it and open a new one as soon as one can be."""
        if self.lease != lease or self._closed:
            return  # already handled, or on the way out
        log.warning("clock lease %s lost (%s): running at default clocks until the daemon is back", lease[:8], why)
        self.lease = None
        with self._control:
            self._lost_at = time.monotonic()
        for task in self._held:
            task.cancel()
        self._reattaching = asyncio.create_task(self._reattach())

    async def _reattach(self) -> None:
        pause, longest = REATTACH_PAUSE_S
        while True:
            await asyncio.sleep(pause)
            try:
                await self._open_lease()
            except (ClockDaemonUnavailable, ClockRequestError, TimeoutError) as exc:
                self.last_error = exc if isinstance(exc, RuntimeError) else ClockDaemonUnavailable(str(exc))
                pause = min(2 * pause, longest)
                continue
            self.reattaches += 1
            log.warning("clock lease re-opened (%s) after a loss; locking the clocks again", self.lease)
            self._pending.update(self._wanted)
            self._wake.set()  # the apply loop locks them again, then counts control as regained
            return

    def _regained(self) -> None:
        with self._control:
            if self._lost_at is not None:
                self._uncontrolled += time.monotonic() - self._lost_at
                self._lost_at = None

    async def _heartbeat(self, lease: str) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self._request("POST", path(RENEW, lease=lease))
            except ClockRequestError as exc:
                self.last_error = exc
                if exc.lease_gone:
                    self._lose(lease, "the daemon no longer knows it")
                    return
                log.warning("clock lease heartbeat failed: %s", exc)
            except ClockDaemonUnavailable as exc:
                self.last_error = exc
                log.warning("clock lease heartbeat failed: %s", exc)

    async def _attach(self, lease: str) -> None:
        # A second connection, held open: the daemon resets our GPUs the moment it closes. Once the stream
        # runs, its end means the lease ended or the daemon went: the lease is lost. Before it runs, a
        # failure to reach the daemon is tried again (the heartbeats tell whether the lease lives).
        why = "the attach stream ended"
        try:
            while not await self._attach_once(lease):
                await asyncio.sleep(0.1)
        except ClockRequestError as exc:
            why = f"attach refused: {exc}"
        except aiohttp.ClientError as exc:
            why = f"the attach stream broke ({type(exc).__name__})"
        finally:
            if not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                self._lose(lease, why)

    async def _attach_once(self, lease: str) -> bool:
        """Hold the attach stream until it ends (True); False if it could not be opened this time."""
        try:
            resp = await self._session.get(
                "http://clockd" + path(ATTACH, lease=lease), timeout=aiohttp.ClientTimeout(total=None)
            )
        except aiohttp.ClientConnectionError:
            return False
        async with resp:
            if resp.status == 404 or (400 <= resp.status < 500 and resp.status not in (409, 429)):
                raise ClockRequestError(resp.status, await resp.json(content_type=None))
            if resp.status >= 400:  # busy for now (429, 503) or our previous stream not yet gone (409)
                return False
            transport = resp.connection.transport if resp.connection else None
            sock = transport.get_extra_info("socket") if transport else None
            fd = sock.fileno() if sock is not None else None
            if fd is not None:
                _attach_fds.add(fd)
            try:
                async for _ in resp.content.iter_any():
                    pass
            finally:
                if fd is not None:
                    _attach_fds.discard(fd)
        return True

    async def _apply(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._busy = True
            while self._pending and self.lease is not None:
                lease = self.lease
                uuid, mhz = self._pending.popitem()
                try:
                    reply = await self._request("POST", path(LOCK, uuid=uuid), {"lease": lease, "mhz": mhz})
                    self.applied[uuid] = reply["applied_mhz"]
                except ClockRequestError as exc:
                    self.last_error = exc
                    if exc.lease_gone:
                        self._pending.setdefault(uuid, mhz)  # locked again under the next lease
                        self._lose(lease, "the daemon no longer knows it")
                        break
                    self.refused.append((mhz, exc))
                    log.warning("clock set %s -> %d MHz refused: %s", uuid, mhz, exc)
                except ClockDaemonUnavailable as exc:
                    self.last_error = exc
                    log.warning("clock set %s -> %d MHz failed: %s", uuid, mhz, exc)
            if self.lease is not None and not self._pending:
                self._regained()
            self._busy = False

    def _queue(self, uuid: str, mhz: int) -> None:
        self._wanted[uuid] = self._pending[uuid] = mhz  # latest wins: an older pending request is replaced
        self._wake.set()

    # ---- the training thread's API ------------------------------------------------------------
    def gpus(self) -> list[dict[str, Any]]:
        reply: dict[str, Any] = self._run(self._request("GET", GPUS))
        return list(reply["gpus"])

    def set(self, gpu_uuid: str, mhz: int) -> None:
        """Ask for ``mhz`` on ``gpu_uuid``; returns at once. Failures land in ``last_error``."""
        if self._closed:
            raise RuntimeError("ClockClient is closed")
        self._loop.call_soon_threadsafe(self._queue, gpu_uuid, int(mhz))

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until every set() so far has been answered, or the lease is lost (tests and benchmarks)."""

        async def drained() -> None:
            while (self._pending or self._wake.is_set() or self._busy) and self.lease is not None:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0)

        self._run(drained(), timeout)

    def energy_mj(self, gpu_uuid: str) -> int:
        reply = self._run(self._request("GET", path(GPU, uuid=gpu_uuid)))
        if reply["energy_mj"] is None:
            raise ClockRequestError(501, {"error": "not_supported", "message": f"{gpu_uuid} has no energy counter"})
        return int(reply["energy_mj"])

    def lock_now(self, gpu_uuid: str, mhz: int) -> dict[str, Any]:
        """Blocking lock with the daemon's answer (applied clock); set() is the non-blocking one."""

        async def lock() -> dict[str, Any]:
            lease = self.lease
            if lease is None:
                raise ClockDaemonUnavailable("no clock lease held (lost; the client is opening a new one)")
            self._wanted[gpu_uuid] = mhz
            reply = dict(await self._request("POST", path(LOCK, uuid=gpu_uuid), {"lease": lease, "mhz": mhz}))
            self.applied[gpu_uuid] = reply["applied_mhz"]
            return reply

        result: dict[str, Any] = self._run(lock())
        return result

    def close(self) -> None:
        """Reset this lease's GPUs and end the lease."""
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            for t in [*self._held, self._apply_task, self._reattaching]:
                if t is not None:
                    t.cancel()
            self._regained()  # the count stops here
            try:
                if self.lease is not None:
                    await self._request("DELETE", path(LEASE, lease=self.lease))
            except (ClockDaemonUnavailable, ClockRequestError) as exc:
                log.warning("closing the clock lease failed (the daemon resets it at TTL): %s", exc)
            finally:
                await self._session.close()

        try:
            self._run(shutdown())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> ClockClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

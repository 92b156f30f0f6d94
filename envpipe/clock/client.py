"""Client of envpipe-clockd for the training runtime.

A background thread runs an asyncio loop that holds the lease: it heartbeats, keeps the ``attach``
connection open (so the daemon resets the GPUs if this process dies), and applies ``set`` requests
(the latest request per GPU wins) without ever blocking the training thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from typing import Any

import aiohttp

from envpipe.clock.protocol import POD_HEADER

DEFAULT_SOCKET = "/run/envpipe/clockd.sock"
SOCKET_ENV = "ENVPIPE_CLOCKD_SOCKET"
# Below the daemon's --header-timeout (it closes idle connections): never reuse one it is closing.
KEEPALIVE_S = 2.0
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


def _unreachable(path: str, exc: BaseException) -> ClockDaemonUnavailable:
    """One line: the socket and the OS's reason (aiohttp's own text names TLS settings that do not apply)."""
    why = getattr(exc, "os_error", None) or exc
    reason = getattr(why, "strerror", None) or str(why) or type(why).__name__
    return ClockDaemonUnavailable(f"envpipe-clockd does not answer on {path}: {reason}")


def list_gpus(socket_path: str | None = None, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The daemon's GPUs (``GET /v1/gpus``) without opening a lease."""
    path = socket_path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
    if not os.path.exists(path):
        raise ClockDaemonUnavailable(f"no envpipe-clockd socket at {path} (set {SOCKET_ENV})")

    async def get() -> list[dict[str, Any]]:
        try:
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=path), timeout=aiohttp.ClientTimeout(total=timeout_s)
                ) as session,
                session.get("http://clockd/v1/gpus") as resp,
            ):
                body = await resp.json(content_type=None)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise _unreachable(path, exc) from exc
        if resp.status >= 400:
            raise ClockRequestError(resp.status, body if isinstance(body, dict) else {"message": str(body)})
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
        self.socket_path = socket_path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        self.ttl_s = ttl_s
        self.last_error: Exception | None = None  # the latest failed set() or heartbeat
        self.refused: list[tuple[int, ClockRequestError]] = []  # every refused set(): (MHz, the daemon's answer)
        self.applied: dict[str, int] = {}  # gpu uuid -> clock the daemon applied last
        self._pending: dict[str, int] = {}
        self._busy = False  # a lock request is in flight
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="envpipe-clock-client", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self.lease = self._run(self._open(gpu_uuids, pod), connect_timeout_s + 5)
        except BaseException:
            self._stop_loop()
            raise

    # ---- the loop thread ----------------------------------------------------------------------
    def _run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _request(self, method: str, path: str, json: Any = None) -> Any:
        try:
            async with self._session.request(method, "http://clockd" + path, json=json) as resp:
                body = await resp.json(content_type=None)
        except aiohttp.ClientConnectionError as exc:
            raise _unreachable(self.socket_path, exc) from exc
        if resp.status >= 400:
            raise ClockRequestError(resp.status, body if isinstance(body, dict) else {"message": str(body)})
        return body

    async def _open(self, gpus: list[str], pod: dict[str, str] | None) -> str:
        if not os.path.exists(self.socket_path):
            raise ClockDaemonUnavailable(f"no envpipe-clockd socket at {self.socket_path} (set {SOCKET_ENV})")
        body: dict[str, Any] = {"gpus": gpus, "ttl_s": self.ttl_s}
        if pod is None and os.environ.get("POD_NAME") and os.environ.get("POD_NAMESPACE"):
            pod = {"namespace": os.environ["POD_NAMESPACE"], "name": os.environ["POD_NAME"]}
        if pod is not None:
            body["pod"] = pod
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.socket_path, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=10),
            # who we say we are on every request: the daemon's rate limits and audit lines per pod
            headers={POD_HEADER: f"{pod['namespace']}/{pod['name']}"} if pod else None,
        )
        self._wake = asyncio.Event()
        try:
            reply = await self._request("POST", "/v1/leases", body)
        except BaseException:
            await self._session.close()
            raise
        lease: str = reply["lease"]
        self._tasks = [
            asyncio.create_task(t) for t in (self._heartbeat(lease), self._attach(lease), self._apply(lease))
        ]
        return lease

    async def _heartbeat(self, lease: str) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self._request("POST", f"/v1/leases/{lease}/renew")
            except (ClockDaemonUnavailable, ClockRequestError) as exc:
                self.last_error = exc
                log.warning("clock lease heartbeat failed: %s", exc)

    async def _attach(self, lease: str) -> None:
        # A second connection, held open: the daemon resets our GPUs the moment it closes.
        with contextlib.suppress(aiohttp.ClientError):
            async with self._session.get(
                f"http://clockd/v1/leases/{lease}/attach", timeout=aiohttp.ClientTimeout(total=None)
            ) as resp:
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

    async def _apply(self, lease: str) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._busy = True
            while self._pending:
                uuid, mhz = self._pending.popitem()
                try:
                    reply = await self._request("POST", f"/v1/gpus/{uuid}/lock", {"lease": lease, "mhz": mhz})
                    self.applied[uuid] = reply["applied_mhz"]
                except ClockRequestError as exc:
                    self.last_error = exc
                    self.refused.append((mhz, exc))
                    log.warning("clock set %s -> %d MHz refused: %s", uuid, mhz, exc)
                except ClockDaemonUnavailable as exc:
                    self.last_error = exc
                    log.warning("clock set %s -> %d MHz failed: %s", uuid, mhz, exc)
            self._busy = False

    def _queue(self, uuid: str, mhz: int) -> None:
        self._pending[uuid] = mhz  # latest wins: an older pending request for this GPU is replaced
        self._wake.set()

    # ---- the training thread's API ------------------------------------------------------------
    def gpus(self) -> list[dict[str, Any]]:
        reply: dict[str, Any] = self._run(self._request("GET", "/v1/gpus"))
        return list(reply["gpus"])

    def set(self, gpu_uuid: str, mhz: int) -> None:
        """Ask for ``mhz`` on ``gpu_uuid``; returns at once. Failures land in ``last_error``."""
        if self._closed:
            raise RuntimeError("ClockClient is closed")
        self._loop.call_soon_threadsafe(self._queue, gpu_uuid, int(mhz))

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until every set() so far has been answered (tests and benchmarks)."""

        async def drained() -> None:
            while self._pending or self._wake.is_set() or self._busy:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0)

        self._run(drained(), timeout)

    def energy_mj(self, gpu_uuid: str) -> int:
        reply = self._run(self._request("GET", f"/v1/gpus/{gpu_uuid}"))
        if reply["energy_mj"] is None:
            raise ClockRequestError(501, {"error": "not_supported", "message": f"{gpu_uuid} has no energy counter"})
        return int(reply["energy_mj"])

    def lock_now(self, gpu_uuid: str, mhz: int) -> dict[str, Any]:
        """Blocking lock with the daemon's answer (applied clock); set() is the non-blocking one."""
        return dict(self._run(self._request("POST", f"/v1/gpus/{gpu_uuid}/lock", {"lease": self.lease, "mhz": mhz})))

    def close(self) -> None:
        """Reset this lease's GPUs and end the lease."""
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            for t in self._tasks:
                t.cancel()
            try:
                await self._request("DELETE", f"/v1/leases/{self.lease}")
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

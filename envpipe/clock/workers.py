"""Serial workers with a deadline on every call: one per GPU, one for the state file.

A driver call can take seconds or never return (a GPU fallen off the bus, a wedged driver). Calls
given to one worker run in order on that worker's own thread; the caller waits at most the deadline.
A call past its deadline is abandoned to its thread: a call still queued behind it is cancelled and
never runs, and the thread is a daemon thread, so a call that never returns holds up neither other
workers nor the process's exit. zeusd gives each GPU one task fed by a channel, but awaits it
without a deadline; here a stuck GPU costs its callers one deadline, and nobody else anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from envpipe.clock.errors import GpuTimeout

T = TypeVar("T")
_Job = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class SerialWorker:
    def __init__(self, name: str, deadline_s: float) -> None:
        self.name = name
        self.deadline_s = deadline_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle = threading.Event()  # clear while a call runs
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker's thread, after every call given before it; GpuTimeout past the
        deadline (the call itself may still run: the worker's next calls wait for it)."""
        job: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((job, fn, args))  # before the first await: calls keep the order they came in
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job), self.deadline_s)
        except TimeoutError:
            what = getattr(fn, "__name__", "call")
            raise GpuTimeout(f"{what} on {self.name} did not return within {self.deadline_s:g} s") from None

    @property
    def busy(self) -> bool:
        """A call is running on the thread now (after a deadline passed: the stuck call)."""
        return not self._idle.is_set()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, fn, args = item
            if not job.set_running_or_notify_cancel():
                continue  # its caller's deadline passed while it waited behind a stuck call
            self._idle.clear()
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, who maps it to an answer
                self._idle.set()
                job.set_exception(exc)
            else:
                self._idle.set()  # before the caller hears of it: idle when it goes on
                job.set_result(result)

    def stop(self) -> None:
        """Let the thread end after its queued calls; never waits for a call that hangs."""
        self._jobs.put(None)

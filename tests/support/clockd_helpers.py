"""Run a real envpipe-clockd in a thread of the test on a Unix socket, and read what it says (its processes and the
HTTP to it: benchmarks/clockd_study/harness.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from envpipe.clock.backends import Backend, SimBackend
from envpipe.clock.daemon import read_state, serve, take_listeners
from envpipe.clock.listen import Lifecycle, ServeOptions
from envpipe.clock.ownership import LocalPolicy, OwnershipPolicy
from envpipe.clock.service import ClockService, ServiceConfig
from envpipe.clock.state import StateFile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def daemon_thread(
    sock: str,
    backend: Backend | None = None,
    policy: OwnershipPolicy | None = None,
    config: ServiceConfig | None = None,
    state: StateFile | None = None,
    **options: Any,
) -> Iterator[ClockService]:
    """A real daemon on ``sock`` in a thread of this process; ``options`` are ServeOptions fields."""
    service = ClockService(backend or SimBackend(4), policy or LocalPolicy(), config or ServiceConfig(), state)
    opts = ServeOptions(sock, None, **options)
    listeners = take_listeners(opts)
    previous = read_state(state)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(serve(service, listeners, opts, previous, Lifecycle(stop, ready.set)))
        except BaseException as exc:
            failed.append(exc)
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(20), "daemon did not start"
    if failed:
        raise failed[0]
    try:
        yield service
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(20)
        loop.close()
        if state is not None:
            state.close()


def wait_for(pred: Any, timeout: float = 10.0) -> float:
    """Seconds until pred() is true (AssertionError after timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def metric(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` in a /metrics text whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]


def one_metric(text: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` with ``labels`` (AssertionError unless exactly one)."""
    found = metric(text, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0][1]

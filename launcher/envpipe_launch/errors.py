"""How the launcher stops early: errors and signals, each turned by the CLI into one line on stderr
and an exit status."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

MESSAGE_LIMIT = 400  # characters: a pasted file or a megabyte-long argument must not flood the terminal


class LaunchError(Exception):
    """Bad input or an infrastructure failure; the message is meant for the user (exit status 2)."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """The launcher received `signum` and exits 128 + signum, as a shell reports a process ended by
    that signal. A BaseException, like KeyboardInterrupt, so `except Exception` in a backend does not
    swallow it and `finally` blocks clean up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def handling(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM inside the block, unless a signal was ignored when this process
    started (a background job of a script ignores SIGINT, and so do its children, by convention). Outside
    the main thread, where Python delivers no signal, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        for s, h in old.items():
            if h != signal.SIG_IGN:
                signal.signal(s, handler)
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` as one printable line: control characters (newlines, escapes, undecodable bytes from
    argv) shown escaped as in Python literals, and at most `limit` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"

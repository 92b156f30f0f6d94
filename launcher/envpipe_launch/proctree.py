"""The processes below this one, found and signalled with psutil.

Every descendant, however deep and whatever its session or process group (a rank that called setsid is
out of reach of a group signal, not of this). psutil knows a process by its pid and start time, so a
pid reused meanwhile is never signalled.
"""

from __future__ import annotations

import contextlib

import psutil


def descendants() -> list[psutil.Process]:
    """This process's children, theirs, and so on (zombies included until someone reaps them)."""
    return psutil.Process().children(recursive=True)


def send(procs: list[psutil.Process], signum: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):  # exited meanwhile
            p.send_signal(signum)

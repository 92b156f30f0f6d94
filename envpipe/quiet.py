"""Keep what native libraries print off the user's terminal.

HiGHS (the planner's MILP solver, inside scipy) prints `HighsMipSolverData::...` lines on standard output from
C++ (envpipe.plan.optimal.milp holds them back around each solve), and torch's profiler (the layer profiler's memory
probe on CPU) prints kineto's `profiler_start` / `profiler_stop` lines on standard error: neither goes through
`sys.stdout` or `sys.stderr`, so only the process's file descriptors can hold them back. While the block runs, the given
descriptors point at /dev/null; Python's buffered output is flushed first, and C's stdio buffers before
they are restored, so that nothing printed inside leaks out afterwards. A process has one descriptor 1 and
one 2: a block must not overlap output another thread writes meanwhile (the planner and the profiler run
on one thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

STDOUT, STDERR = 1, 2


@contextlib.contextmanager
def native_output_silenced(fds: tuple[int, ...] = (STDOUT,)) -> Iterator[None]:
    for stream in (sys.stdout, sys.__stdout__, sys.stderr, sys.__stderr__):
        with contextlib.suppress(Exception):  # a closed or replaced stream (pytest, click's runner)
            if stream is not None:
                stream.flush()
    saved = [os.dup(fd) for fd in fds]
    try:
        with open(os.devnull, "wb") as null:
            for fd in fds:
                os.dup2(null.fileno(), fd)
        yield
    finally:
        _flush_c_stdio()
        for fd, copy in zip(fds, saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def _flush_c_stdio() -> None:
    """fflush(NULL): C's stdout buffer (a pipe or file makes it block-buffered) goes to /dev/null now, not later."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)

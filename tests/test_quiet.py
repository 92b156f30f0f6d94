"""What native code prints inside `native_output_silenced` never reaches the process's descriptors; what
Python printed before the block still does, in order."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import ctypes, sys
from envpipe.quiet import STDERR, STDOUT, native_output_silenced
libc = ctypes.CDLL(None)
print("before", flush=False)
with native_output_silenced((STDOUT, STDERR)):
    libc.printf(b"HighsMipSolverData::noise\n")
    libc.dprintf(2, b"profiler_stop\n")
libc.printf(b"after\n")
libc.fflush(None)
"""


def test_native_output_is_silenced_and_nothing_leaks_later() -> None:
    # stdout a pipe: C's stdio buffers it whole, so a missing fflush inside the block would leak it later
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout == "before\nafter\n" and res.stderr == ""

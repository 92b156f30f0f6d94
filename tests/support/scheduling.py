"""How long this process goes without the CPU right now, for tests whose bounds are wall-clock times.

A lease that must survive a TTL, or a call that must answer within a bound, holds only if the process gets the
CPU in time; on a busy machine (a build, another engineer's tests: load 16 on 2 cores) it may not for a second or
more. Tests derive such bounds from a measurement instead of a constant: the longest a short sleep overran while
the test's own load runs, times a factor, never less than the bound the test was written with.
"""

from __future__ import annotations

import time

# a stall must last this many worst measured overruns before a bound derived here fails: the measurement is a
# sample (0.3 s); the stalls it misses are seldom 10 times its worst (measured at load 12-16 on the 2-core VM)
FACTOR = 10.0


def scheduling_delay_s(seconds: float = 0.3, step_s: float = 0.005) -> float:
    """The longest a ``step_s`` sleep of this thread overran during ``seconds`` (at least the step itself)."""
    worst, end = step_s, time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        time.sleep(step_s)
        worst = max(worst, time.monotonic() - t0 - step_s)
    return worst


def bound_s(nominal_s: float, delay_s: float | None = None) -> float:
    """``nominal_s``, or FACTOR times the measured scheduling delay if that is longer."""
    measured = scheduling_delay_s() if delay_s is None else delay_s
    return max(nominal_s, FACTOR * measured)

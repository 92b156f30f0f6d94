"""The user's wall-clock limit on the optimal planner's search (`envpipe plan --time-limit`), off by default.

Every limit inside the planner is a count (iterations, branch-and-bound nodes, rounds), so the same input gives
the same plan at any load. A user who needs an answer by a deadline may give one: the search then reads the clock
between its steps and, once the time is up, finishes with what it has (always a plan within the budget, never a
half-made one) and says what it left out. Without a limit no clock is read at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TimeLimit:
    """``seconds`` from when it is made (None: no limit, and the clock is never read); ``clock`` for tests
    (default: time.monotonic, looked up when read)."""

    seconds: float | None = None
    clock: Callable[[], float] | None = None
    skipped: list[str] = field(default_factory=list)  # what the limit cut, in the order it was cut
    _end: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.seconds is not None:
            if not self.seconds > 0:
                raise ValueError(f"the time limit must be positive, got {self.seconds}")
            self._end = self._now() + self.seconds

    def _now(self) -> float:
        return (self.clock or time.monotonic)()

    def left_s(self) -> float | None:
        """Seconds left (at least a millisecond, for a solver's own limit), or None without a limit."""
        return None if self._end is None else max(self._end - self._now(), 1e-3)

    def up(self, skipping: str) -> bool:
        """True once the time is up, recording that ``skipping`` is left out for it (each only once)."""
        if self._end is None or self._now() < self._end:
            return False
        if skipping not in self.skipped:
            self.skipped.append(skipping)
        return True

    def note(self) -> tuple[str, ...]:
        """The plan's line saying the limit cut the search short (none if it did not)."""
        if not self.skipped:
            return ()
        return (f"search cut short by the time limit ({self.seconds:g} s): left out {'; '.join(self.skipped)}; "
                "without a limit the same input always gives the same plan",)


"""A one-line progress bar on stderr (a terminal gets \\r updates, a log gets one line per change)."""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, label: str, total: int, width: int = 30) -> None:
        self.label, self.total, self.width, self.last = label, total, width, -1

    def update(self, n: int) -> None:
        if n == self.last:
            return
        self.last = n
        filled = self.width * n // max(self.total, 1)
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {n}/{self.total}"
        end = "\r" if sys.stderr.isatty() else "\n"
        sys.stderr.write(line + end)
        sys.stderr.flush()

    def done(self) -> None:
        if sys.stderr.isatty():
            sys.stderr.write("\n")

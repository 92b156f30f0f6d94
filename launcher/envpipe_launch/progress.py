"""Progress of a count (workers ready) on stderr: a rich bar on a terminal, one line per change in a
log (kubectl logs, CI), where a redrawn bar would show nothing until the end."""

from __future__ import annotations

import atexit
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.last = label, total, -1
        console = Console(file=sys.stderr)
        self.bar: RichProgress | None = None
        if console.is_terminal:
            self.bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=console,
            )
            self.task = self.bar.add_task(label, total=total)
            self.bar.start()
            atexit.register(self.done)  # a launch that fails while waiting must not leave the cursor hidden

    def update(self, n: int) -> None:
        if n == self.last:
            return
        self.last = n
        if self.bar is not None:
            self.bar.update(self.task, completed=n)
        else:
            print(f"{self.label} {n}/{self.total}", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.bar is not None:
            self.bar.stop()  # idempotent
            atexit.unregister(self.done)

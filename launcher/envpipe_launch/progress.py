"""Progress of a count (nodes ready) on stderr: a tqdm bar on a terminal (tqdm, like the planner's
progress and a dependency of DeepSpeed's already), one line per change in a log (kubectl logs, CI),
where a redrawn bar would show nothing but carriage returns."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.last = label, total, -1
        self.bar = tqdm(total=total, desc=label, unit="node", file=sys.stderr, disable=None)  # None: tty only

    def update(self, n: int) -> None:
        if n == self.last:
            return
        self.last = n
        if self.bar.disable:
            print(f"{self.label} {n}/{self.total}", file=sys.stderr, flush=True)
        else:
            self.bar.n = n  # may go down: a worker can turn unready
            self.bar.refresh()

    def done(self) -> None:
        self.bar.close()

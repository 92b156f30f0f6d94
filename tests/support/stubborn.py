"""Processes that are hard to stop, for the launcher's signal tests: `stubborn.py MODE DIR`.

MODE
  ignore  ignores SIGTERM and SIGINT
  slow    exits 0.5 s after SIGTERM or SIGINT
  escape  leaves a grandchild behind that ignores both, in a session of its own (setsid) and
          reparented at once (its parent exits), then waits like a plain process
  all     starts one process of each mode above, then waits
  rank    a DeepSpeed rank (--local_rank=N is dropped): the mode by $LOCAL_RANK, 0 ignore, 1 slow,
          2 escape
DIR, a directory of the test's own, is in the command line of every process, so a test finds them
all (`marked`); each process but `all` creates DIR/ready.<mode>.<pid> once its signal handling is in
place (`wait_ready`).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

MODES = ("ignore", "slow", "escape")
READY = len(MODES) + 1  # ready files of `all` or of three ranks: the escaped grandchild makes one more


def _ignore() -> None:
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)


def _ready(directory: str, mode: str) -> None:
    open(os.path.join(directory, f"ready.{mode}.{os.getpid()}"), "w").close()


def main() -> None:
    mode, directory = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    if mode == "rank":
        mode = MODES[int(os.environ["LOCAL_RANK"])]
    if mode == "all":
        children = [subprocess.Popen([sys.executable, __file__, m, directory]) for m in MODES]
        for child in children:
            child.wait()
        return
    if mode == "ignore":
        _ignore()
    elif mode == "slow":
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, lambda *_: (time.sleep(0.5), sys.exit(0)))
    elif mode == "escape":
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                _ignore()
                _ready(directory, "escaped")
                time.sleep(600)
            os._exit(0)
        os.waitpid(pid, 0)
    _ready(directory, mode)
    time.sleep(600)


def marked(directory: Path) -> list[psutil.Process]:
    """The running processes with `directory` in their command line, a supervisor's own excepted."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = p.info["cmdline"] or []
        supervisor = "envpipe_launch.supervise" in cmdline
        if str(directory) in cmdline and not supervisor and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def wait_ready(directory: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(directory.glob("ready.*"))) < READY:
        assert time.monotonic() < deadline, f"not ready after {timeout_s}s: {sorted(directory.iterdir())}"
        time.sleep(0.05)


if __name__ == "__main__":
    main()

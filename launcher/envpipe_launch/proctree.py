"""Stop a daemon with everything it started, and wait until none of it runs.

A process group is not enough: sshd gives each connection (even a port probe) a child in a session of
its own (setsid), and such a child can outlive its stopped parent, reparented and still running. So the
tree is followed by parent pid, from /proc, while the parents still live. A process is known by its pid
and start time, so a pid reused meanwhile is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

from .errors import LaunchError

KILL_WAIT_S = 5.0  # after SIGKILL: only a process stuck in the kernel takes longer


class Proc(NamedTuple):
    ppid: int
    pgrp: int
    start: int  # clock ticks after boot: with the pid, the process's identity


def running() -> dict[int, Proc]:
    """Every process that runs (zombies hold nothing), by pid, from /proc."""
    procs = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)", which may hold spaces: state is field 3
        if fields[0] != "Z":
            procs[int(entry)] = Proc(ppid=int(fields[1]), pgrp=int(fields[2]), start=int(fields[19]))
    return procs


def tree(leader: int, procs: dict[int, Proc], known: dict[int, int]) -> dict[int, int]:
    """pid -> start of the running processes in `leader`'s group or in `known`, and all their descendants."""
    found = {pid for pid, p in procs.items() if p.pgrp == leader or known.get(pid) == p.start}
    while children := {pid for pid, p in procs.items() if p.ppid in found} - found:
        found |= children
    return {pid: procs[pid].start for pid in found}


def stop(leader: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM `leader` (started with start_new_session) and everything it started, SIGKILL what is left
    after `timeout_s`, and return once none of it runs; the leader is reaped.

    The tree is first taken in the SIGTERM pass before it signals anything: a stopped parent's children
    are reparented, and only a process already tracked is still followed after that."""
    tracked: dict[int, int] = {}
    for signum, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, KILL_WAIT_S)):
        if _signal_until_gone(leader, tracked, signum, wait_s):
            return
    raise LaunchError(f"processes {sorted(_alive(tracked, running()))} started by pid {leader.pid} survived SIGKILL")


def _alive(tracked: dict[int, int], procs: dict[int, Proc]) -> set[int]:
    return {pid for pid, start in tracked.items() if pid in procs and procs[pid].start == start}


def _signal_until_gone(leader: subprocess.Popen, tracked: dict[int, int], signum: int, wait_s: float) -> bool:
    signalled: set[int] = set()
    deadline = time.monotonic() + wait_s
    while True:
        leader.poll()  # reap the leader as soon as it exits
        procs = running()
        tracked.update(tree(leader.pid, procs, tracked))  # a child forked meanwhile joins
        alive = _alive(tracked, procs)
        if not alive and leader.returncode is not None:
            return True
        for pid in alive - signalled:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        signalled |= alive
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)

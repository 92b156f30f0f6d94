"""Run a command so that nothing it starts outlives it or the launcher: a small supervisor process.

    launcher ──lifeline pipe──> supervisor (own session, child subreaper) ──> the command ──> ...

- The supervisor is a *child subreaper* (prctl PR_SET_CHILD_SUBREAPER): a process the command leaves
  behind (double-forked, setsid, a rank whose parent died) is reparented to it instead of to init, so
  its descendants are always the whole job, found with psutil.
- SIGINT or SIGTERM to the supervisor is forwarded to every one of those processes; whatever still runs
  after the stop timeout (a rank that ignores SIGTERM or handles it slowly) gets SIGKILL; a second
  signal sends SIGKILL at once. When the command itself ends, anything it left running is stopped too.
- The launcher holds the write end of a pipe: if the launcher dies, even by SIGKILL, the pipe closes
  and the supervisor stops the job as on SIGTERM.
- A forked guard waits for the supervisor's death (PR_SET_PDEATHSIG): if the supervisor itself is
  killed with SIGKILL, the guard stops the job's process group (the supervisor's: it leads its own
  session) the same way, SIGTERM then SIGKILL after the stop timeout. What left the group (a setsid
  escapee) is out of its reach: only the living supervisor, their subreaper, still finds those.
Why not a cgroup: creating one needs root or a delegated cgroup v2 subtree, and inside most containers
/sys/fs/cgroup is read-only; a subreaper and a pipe need neither (Linux >= 3.4, any user). What it
cannot reach: processes on other hosts (DeepSpeed's runner stops those with `pkill` over pdsh when
it gets the signal) and anything that a daemon outside the job starts on its behalf.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

import psutil

from . import proctree
from .errors import STOP_SIGNALS, Stopped, handling

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
KILL_WAIT_S = 5.0  # after SIGKILL: only a process stuck in the kernel takes longer
STOP_POLL_S = 0.05


class Supervised:
    """`argv` started under a supervisor; the launcher's side."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, stop_timeout_s: float = 10.0,
                 stdin: Any = None, stdout: Any = None, stderr: Any = None, cwd: str | None = None) -> None:
        read_end, self._lifeline = os.pipe()
        # Blocked until the supervisor has its handlers: a signal sent meanwhile waits instead of
        # killing it half-started (the mask is inherited through fork and exec).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, "--lifeline-fd", str(read_end),
                 "--stop-timeout", repr(stop_timeout_s), *(["--cwd", cwd] if cwd else []), "--", *argv],
                env=env,
                pass_fds=(read_end,),
                start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only, which forwards it
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
            )
        except BaseException:
            os.close(self._lifeline)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(read_end)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        """Ask the supervisor to stop the job with `signum` (a second signal: SIGKILL at once)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def wait(self) -> int:
        """The command's exit status (128 + N if signal N ended it), once all of the job is gone."""
        try:
            return self.proc.wait()
        finally:
            with contextlib.suppress(OSError):
                os.close(self._lifeline)

    def stop(self) -> int:
        self.signal(signal.SIGTERM)
        return self.wait()


def run(argv: list[str], env: dict[str, str] | None = None, stop_timeout_s: float = 10.0,
        cwd: str | None = None) -> int:
    """Run `argv` (in `cwd`) to its end and return its exit status. SIGINT/SIGTERM to this process stop the whole
    job; once none of it runs, Stopped(signum) is raised (the CLI exits 128 + signum)."""
    received: list[int] = []
    job: Supervised | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if job is not None:
            job.signal(signum)

    with handling(forward):
        job = Supervised(argv, env, stop_timeout_s, cwd=cwd)
        if received:  # a signal came while the supervisor was starting
            job.signal(received[0])
        status = job.wait()
    if received:
        raise Stopped(received[0])
    return status


class Supervisor:
    """The supervisor process's side."""

    def __init__(self, argv: list[str], lifeline_fd: int, stop_timeout_s: float, cwd: str | None = None) -> None:
        self.argv, self.lifeline, self.stop_timeout_s, self.cwd = argv, lifeline_fd, stop_timeout_s, cwd
        self.signals: list[int] = []
        self.status: int | None = None  # the command's, once it is reaped
        self.stop_signal: int | None = None
        self.kill_at = self.give_up_at = float("inf")
        self.guard: int | None = None

    def run(self) -> int:
        if not _become_subreaper():
            print("envpipe-launch: warning: not a child subreaper (Linux only): processes that leave "
                  "the job's tree are not stopped with it", file=sys.stderr)
        self.guard = _start_guard(self.stop_timeout_s)
        try:
            return self._supervise()
        finally:
            if self.guard is not None:  # the job is over: the guard has nothing left to guard
                with contextlib.suppress(ProcessLookupError, ChildProcessError):
                    os.kill(self.guard, signal.SIGKILL)
                    os.waitpid(self.guard, 0)

    def _supervise(self) -> int:
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)  # a signal (SIGCHLD included) wakes the poll below
        for s in STOP_SIGNALS:
            signal.signal(s, lambda signum, _frame: self.signals.append(signum))
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # see Supervised: now they are handled
        try:
            if self.cwd is not None:  # the command's (the supervisor itself needs none)
                os.chdir(self.cwd)
            # the dispositions Python changed go back to the defaults, as subprocess does
            self.leader = os.posix_spawnp(self.argv[0], self.argv, os.environ,
                                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), setsigmask=())
        except OSError as e:
            print(f"envpipe-launch: error: cannot run {self.argv[0]}: {e.strerror or e}", file=sys.stderr)
            return 127
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        poller.register(self.lifeline, select.POLLIN | select.POLLHUP)
        while True:
            waiting = self.stop_signal is not None
            for fd, _ in poller.poll(STOP_POLL_S * 1000 if waiting else None):
                if fd == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
                else:  # the launcher is gone: its end of the pipe closed
                    poller.unregister(self.lifeline)
                    self.begin_stop(signal.SIGTERM)
            self.reap()
            for signum in self.signals:
                self.begin_stop(signum)
            self.signals.clear()
            if self.status is not None and self.stop_signal is None:
                self.begin_stop(signal.SIGTERM, leftovers=True)
            if self.stop_signal is not None and self.stopped():
                return 0 if self.status is None else self.status

    def reap(self) -> None:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.leader:
                code = os.waitstatus_to_exitcode(wait_status)
                self.status = code if code >= 0 else 128 - code
            elif pid == self.guard:  # gone early (killed by someone): the job runs unguarded
                self.guard = None

    def job(self) -> list[psutil.Process]:
        """Every process of the job: the supervisor's descendants but its guard."""
        return [p for p in proctree.descendants() if p.pid != self.guard]

    def begin_stop(self, signum: int, leftovers: bool = False) -> None:
        now = time.monotonic()
        if self.stop_signal is not None:  # asked again: no more waiting
            self.kill_at = min(self.kill_at, now)
            return
        procs = self.job()
        self.stop_signal = signum
        self.kill_at, self.give_up_at = now + self.stop_timeout_s, now + self.stop_timeout_s + KILL_WAIT_S
        if leftovers and procs:
            pids = ", ".join(str(p.pid) for p in procs[:10])
            print(f"envpipe-launch: the job ended and left {len(procs)} process(es) running ({pids}); "
                  "stopping them", file=sys.stderr)
        proctree.send(procs, signum)

    def stopped(self) -> bool:
        """True once none of the job runs (or, after SIGKILL, when waiting longer is pointless)."""
        self.reap()
        procs = self.job()
        if not procs:
            return True
        now = time.monotonic()
        if now >= self.kill_at:
            proctree.send(procs, signal.SIGKILL)
        if now >= self.give_up_at:
            print(f"envpipe-launch: processes {[p.pid for p in procs]} survived SIGKILL", file=sys.stderr)
            return True
        return False


def set_prctl(option: int, value: int) -> bool:
    """prctl(option, value) on this process; False where it fails or libc has none."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    return prctl is not None and prctl(option, value, 0, 0, 0) == 0


def _start_guard(stop_timeout_s: float) -> int | None:
    """Fork the guard (see the module's docstring); its pid, or None where it cannot work: no prctl,
    or this process does not lead its process group (stopping the group would reach the launcher)."""
    supervisor = os.getpid()
    if os.getpgrp() != supervisor:
        return None
    pid = os.fork()
    if pid:
        return pid
    try:  # the guard: it runs no Python code of the supervisor's after this point
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, *STOP_SIGNALS})  # its group's stop is not its
        if set_prctl(PR_SET_PDEATHSIG, signal.SIGUSR1) and os.getppid() == supervisor:
            signal.sigwait({signal.SIGUSR1})  # the supervisor died (or it had, just before the prctl)
        elif os.getppid() == supervisor:
            os._exit(0)  # no prctl: no guard
        os.killpg(supervisor, signal.SIGTERM)
        time.sleep(stop_timeout_s)
        os.killpg(supervisor, signal.SIGKILL)  # the guard included
    finally:
        os._exit(0)


def _become_subreaper() -> bool:
    return set_prctl(PR_SET_CHILD_SUBREAPER, 1)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m envpipe_launch.supervise", description=__doc__.split("\n")[0])
    ap.add_argument("--lifeline-fd", type=int, required=True)
    ap.add_argument("--stop-timeout", type=float, default=10.0)
    ap.add_argument("--cwd", default=None)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        ap.error("no command")
    sys.exit(Supervisor(argv, args.lifeline_fd, args.stop_timeout, args.cwd).run())


if __name__ == "__main__":
    main()

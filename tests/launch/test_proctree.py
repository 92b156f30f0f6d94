"""The supervisor (envpipe_launch.supervise) with real processes: whatever the job starts ends with it.

Each job carries a directory of its test in the command lines of its processes (tests/support/stubborn.py),
so a test finds every one of them (a setsid, double-forked grandchild included) without trusting the
code under test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from envpipe_launch import deepspeed_cmd, supervise
from envpipe_launch.errors import Stopped

from tests.support.clockd_helpers import wait_for
from tests.support.stubborn import marked, wait_ready

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
STUBBORN = [sys.executable, str(ROOT / "tests" / "support" / "stubborn.py"), "all"]  # + a directory


def _stubborn_job(tmp_path: Path, stop_timeout_s: float) -> tuple[supervise.Supervised, Path]:
    job = supervise.Supervised([*STUBBORN, str(tmp_path)], stop_timeout_s=stop_timeout_s)
    wait_ready(tmp_path)
    return job, tmp_path


def test_exit_status_passes_through() -> None:
    assert supervise.Supervised(["bash", "-c", "exit 7"]).wait() == 7
    assert supervise.Supervised(["bash", "-c", "kill -TERM $$"]).wait() == 128 + signal.SIGTERM


def test_sigterm_stops_what_ignores_it_handles_it_slowly_or_left_the_tree(tmp_path: Path) -> None:
    job, mark = _stubborn_job(tmp_path, stop_timeout_s=1.0)
    assert any(os.getsid(p.pid) != os.getsid(job.pid) for p in marked(mark))  # the premise: one left the session
    t0 = time.monotonic()
    job.signal(signal.SIGTERM)
    job.wait()
    assert time.monotonic() - t0 >= 1.0  # the stubborn ones waited for the stop timeout, then SIGKILL
    assert marked(mark) == []


def test_a_second_signal_kills_at_once(tmp_path: Path) -> None:
    job, mark = _stubborn_job(tmp_path, stop_timeout_s=60.0)
    t0 = time.monotonic()
    job.signal(signal.SIGINT)
    time.sleep(0.3)
    job.signal(signal.SIGINT)
    job.wait()
    assert time.monotonic() - t0 < 10 and marked(mark) == []


def test_what_the_job_leaves_behind_is_stopped_when_it_ends(tmp_path: Path, capfd) -> None:
    """A daemon the job left running (setsid, reparented to the supervisor) is stopped when the job ends, and the
    supervisor's line names it. The test counts only the job's own process, the daemon (its pid in a file, its
    directory in its command line): what else the supervisor may list is not this test's to count, so a busy
    machine's timing cannot make it fail."""
    daemon = "import os, sys, time; open(sys.argv[1] + '/pid', 'w').write(str(os.getpid())); time.sleep(60)"
    script = f'(setsid python3 -c "{daemon}" "$1" &); while [ ! -s "$1/pid" ]; do sleep 0.05; done; exit 3'
    assert supervise.Supervised(["bash", "-c", script, "job", str(tmp_path)], stop_timeout_s=1.0).wait() == 3
    assert marked(tmp_path) == []
    left = re.search(r"the job ended and left (\d+) process\(es\) running \(([\d, ]+)\)", capfd.readouterr().err)
    assert left is not None and (tmp_path / "pid").read_text() in left.group(2).split(", ")


def test_sigkill_of_the_launcher_stops_the_job(tmp_path: Path) -> None:
    """The launcher here is a real process that we SIGKILL: no handler of its runs, the pipe closes."""
    mark = tmp_path
    code = (
        "import sys, time; from envpipe_launch import supervise; "
        f"supervise.Supervised({[*STUBBORN, str(mark)]!r}, stop_timeout_s=1.0); "
        "time.sleep(600)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], env=ENV)
    wait_ready(mark)
    launcher.kill()
    launcher.wait()
    wait_for(lambda: marked(mark) == [], timeout=1.0 + supervise.KILL_WAIT_S)


def test_sigkill_of_the_supervisor_stops_its_process_group(tmp_path: Path) -> None:
    """The guard: SIGKILL of the supervisor itself stops what is left of the job in its process group,
    the stubborn ones by SIGKILL after the stop timeout. The setsid escapee is beyond it (documented)."""
    job, mark = _stubborn_job(tmp_path, stop_timeout_s=1.0)
    group = os.getpgid(job.pid)
    escapees = [p for p in marked(mark) if os.getsid(p.pid) != os.getsid(job.pid)]
    try:
        os.kill(job.pid, signal.SIGKILL)
        assert job.wait() == -signal.SIGKILL
        wait_for(lambda: [p for p in marked(mark) if p not in escapees] == [], timeout=1.0 + supervise.KILL_WAIT_S)
        wait_for(lambda: not any(_in_group(p, group) for p in psutil.process_iter()), timeout=5)  # the guard too
    finally:
        for p in escapees:
            p.kill()


def _in_group(p: psutil.Process, group: int) -> bool:
    try:
        return os.getpgid(p.pid) == group and p.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.NoSuchProcess):
        return False


def test_the_guard_ends_with_a_job_that_ends_normally(tmp_path: Path) -> None:
    job = supervise.Supervised(["bash", "-c", f"touch {tmp_path}/started; sleep 0.5"])
    group = os.getpgid(job.pid)
    wait_for(lambda: (tmp_path / "started").exists(), timeout=20)  # the guard is forked before the command
    assert sum(_in_group(p, group) for p in psutil.process_iter()) == 3  # the supervisor, its guard, the command
    assert job.wait() == 0
    assert not any(_in_group(p, group) for p in psutil.process_iter())


def test_run_forwards_the_signal_and_raises_stopped_once_the_job_is_gone(tmp_path: Path) -> None:
    mark = tmp_path
    code = (
        "import sys; from envpipe_launch import supervise; from envpipe_launch.errors import Stopped\n"
        "try:\n"
        f"    supervise.run({[*STUBBORN, str(mark)]!r}, stop_timeout_s=1.0)\n"
        "except Stopped as e:\n"
        "    sys.exit(e.exit_status)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], env=ENV)
    wait_ready(mark)
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=30) == 130
    assert marked(mark) == []  # gone before the launcher returned
    assert issubclass(Stopped, BaseException) and not issubclass(Stopped, Exception)


def test_a_missing_command_is_one_line(capfd) -> None:
    assert supervise.Supervised(["envpipe-no-such-command"]).wait() == 127
    err = capfd.readouterr().err
    assert err == "envpipe-launch: error: cannot run envpipe-no-such-command: No such file or directory\n"


@pytest.mark.parametrize(("status", "code"), [(241, 143), (254, 130), (247, 137), (255, 255), (7, 7)])
def test_deepspeeds_status_for_a_rank_killed_by_a_signal_reads_as_the_shells(status: int, code: int) -> None:
    # DeepSpeed's launch.py does sys.exit(-N) for a rank killed by signal N: status 256 - N (old: passed on)
    argv = [sys.executable, "-c", f"import sys; sys.exit({status})"]
    assert deepspeed_cmd.run(argv, dict(os.environ), stop_timeout_s=1.0) == code

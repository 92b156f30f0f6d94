"""envpipe_launch.proctree with real processes: a daemon, its children and its setsid children all stop."""

from __future__ import annotations

import subprocess
import time

import pytest
from envpipe_launch import proctree
from envpipe_launch.errors import LaunchError

from tests.clockd_helpers import wait_for


def _start(script: str, processes: int) -> subprocess.Popen:
    """A bash leader in its own session; returns once its tree has `processes` running processes."""
    leader = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    wait_for(lambda: len(proctree.tree(leader.pid, proctree.running(), {})) >= processes)  # its children started
    return leader


def _gone(pids: dict[int, int]) -> bool:
    procs = proctree.running()
    return all(procs.get(pid, proctree.Proc(0, 0, -1)).start != start for pid, start in pids.items())


def test_stop_ends_the_leader_and_every_child() -> None:
    leader = _start("sleep 60 & sleep 60 & wait", processes=3)
    pids = proctree.tree(leader.pid, proctree.running(), {})
    proctree.stop(leader)
    assert leader.returncode is not None and _gone(pids)


def test_a_child_in_its_own_session_that_outlives_the_leader_is_waited_for() -> None:
    # like sshd's per-connection child: setsid, so not in the leader's group; it takes 0.5 s to go on SIGTERM
    leader = _start("setsid bash -c \"trap 'sleep 0.5; exit 0' TERM; sleep 60 & wait\" & wait", processes=3)
    pids = proctree.tree(leader.pid, proctree.running(), {})
    assert {proctree.running()[pid].pgrp for pid in pids} != {leader.pid}  # the test's premise
    proctree.stop(leader)
    assert _gone(pids)


def test_what_ignores_sigterm_is_killed_after_the_timeout() -> None:
    leader = _start("trap '' TERM; sleep 60 & wait", processes=2)  # sleep inherits the ignored SIGTERM
    pids = proctree.tree(leader.pid, proctree.running(), {})
    t0 = time.monotonic()
    proctree.stop(leader, timeout_s=0.3)
    assert time.monotonic() - t0 >= 0.3 and _gone(pids)


def test_a_leader_already_gone_is_fine() -> None:
    leader = subprocess.Popen(["true"], start_new_session=True)
    leader.wait()
    proctree.stop(leader)


def test_a_reused_pid_is_not_followed() -> None:
    procs = {10: proctree.Proc(1, 10, 5), 11: proctree.Proc(10, 10, 6), 12: proctree.Proc(1, 12, 9)}
    # 12 was known with start time 8: a different process now holds that pid
    assert proctree.tree(10, procs, {12: 8}) == {10: 5, 11: 6}
    assert proctree.tree(10, procs, {12: 9}) == {10: 5, 11: 6, 12: 9}


def test_a_process_that_survives_sigkill_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    leader = subprocess.Popen(["true"], start_new_session=True)
    leader.wait()
    stuck = 99_999_999  # above any pid_max: the signals sent to it reach nobody
    monkeypatch.setattr(proctree, "running", lambda: {stuck: proctree.Proc(1, leader.pid, 7)})
    monkeypatch.setattr(proctree, "KILL_WAIT_S", 0.1)
    with pytest.raises(LaunchError, match=rf"processes \[{stuck}\] started by pid {leader.pid} survived SIGKILL"):
        proctree.stop(leader, timeout_s=0.1)

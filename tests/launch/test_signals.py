"""Signals to the launcher: with real DeepSpeed (local backend, CPU ranks) exit status 128 + signal and
nothing of the job left running, stubborn ranks included (tests/support/stubborn.py: one ignores SIGTERM and
SIGINT, one takes 0.5 s over them, one leaves a setsid'd grandchild behind); with the kube backend
(against the fake API server of tests/support/fakes/kube_api.py) SIGTERM cleans up like Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from envpipe_launch.supervise import KILL_WAIT_S

from tests.support.clockd_helpers import wait_for
from tests.support.fakes.kube_api import FakeKubeAPI
from tests.support.stubborn import marked, wait_ready

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
STOP_TIMEOUT_S = 1.0


def _launch(*args: str, cwd: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "envpipe_launch", "--stop-timeout", str(STOP_TIMEOUT_S), *args]
    return subprocess.Popen(argv, env=ENV, cwd=cwd, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)]
)
def test_a_signal_to_the_launcher_leaves_nothing_running(tmp_path: Path, signum: int, status: int) -> None:
    stubborn = str(ROOT / "tests" / "support" / "stubborn.py")
    launcher = _launch("--gpus-per-node", "3", stubborn, "rank", str(tmp_path), cwd=tmp_path)
    wait_ready(tmp_path)
    launcher.send_signal(signum)
    _, err = launcher.communicate(timeout=60)  # stderr closes once the supervisor is gone too
    assert launcher.returncode == status, err[-2000:]
    if signum != signal.SIGKILL:
        assert err.endswith(f"envpipe-launch: interrupted by {signal.Signals(signum).name}\n"), err[-2000:]
        assert marked(tmp_path) == []  # all gone before the launcher exited
    wait_for(lambda: marked(tmp_path) == [], timeout=STOP_TIMEOUT_S + KILL_WAIT_S)


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_gives_128_plus_the_signal(tmp_path: Path) -> None:
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    launcher = _launch("--gpus-per-node", "1", str(script), cwd=tmp_path)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signal.SIGTERM, err[-2000:]  # DeepSpeed itself exits 241


def test_sigterm_while_kube_workers_start_cleans_up_and_gives_143(tmp_path: Path) -> None:
    """SIGTERM unwinds through the kube backend's cleanup like Ctrl-C (the old launcher died at once
    with Python's default SIGTERM action and left the pods, Service and Secret behind)."""
    api = FakeKubeAPI().start()
    try:
        api.start_delay_s = 60  # the workers never get ready: the launcher is waiting when SIGTERM comes
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        argv = [sys.executable, "-m", "envpipe_launch", "--backend", "kube", "--nodes", "2", "--image", "img:1",
                "--name", "t", "--", "train.py"]
        proc = subprocess.Popen(argv, env={**ENV, "KUBECONFIG": str(kubeconfig)}, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(api.names("pods")) == 2, timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err
        assert err.endswith("envpipe-launch: interrupted by SIGTERM\n"), err
        assert not any(api.names(kind) for kind in ("pods", "jobs", "services", "secrets", "configmaps"))
    finally:
        api.stop()

"""The envpipe-clockd command line: bad flags fail clearly; TCP and metrics listeners serve."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.clockd_study.harness import call, daemon_process
from envpipe.clock.daemon import main
from tests.support.ports import free_port


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "sim", "--tcp", "0.0.0.0:4939"], "loopback"),
        (["--backend", "sim", "--tcp", "localhost"], "HOST:PORT"),
        (["--backend", "sim", "--socket-mode", "rw"], "octal"),
        (["--backend", "sim", "--socket", ""], "give --socket or --tcp"),
        (["--backend", "sim", "--min-mhz", "1500", "--max-mhz", "900"], "allow-list is empty"),
        (["--backend", "cuda"], "'cuda' is not one of"),
        (["--lease-ttl", "0"], "0.5<=x<=300"),
        *(
            ([flag, value], "not a finite number" if value == "nan" else "range")
            for flag in ("--lease-ttl", "--max-rps", "--driver-deadline", "--header-timeout", "--body-timeout")
            for value in ("nan", "inf", "-inf")
        ),
        (["--backend", "sim", "--reset-all-and-exit"], "--reset-all-and-exit needs --state-file"),
        (["--backend", "sim", "--guard", "--socket", ""], "--guard needs --state-file"),
    ],
)
def test_bad_flags_fail_with_a_clear_message(args, message, tmp_path) -> None:
    result = CliRunner().invoke(main, [*args, "--socket", str(tmp_path / "c.sock")] if "--socket" not in args else args)
    assert result.exit_code != 0 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "c.sock").exists()


def test_by_hand_the_default_ownership_is_the_kubelets_and_without_a_kubelet_it_does_not_start(tmp_path) -> None:
    """The chart's setting is the default: a daemon started by hand on a shared machine does not let any caller
    lock any GPU. Without a kubelet socket it says in one line what to give instead, and takes nothing."""
    sock, kubelet = tmp_path / "run" / "c.sock", tmp_path / "kubelet.sock"
    argv = [sys.executable, "-m", "envpipe.clock.daemon", "--backend", "sim", "--socket", str(sock),
            "--pod-resources-socket", str(kubelet)]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "--ownership kubelet (the default)" in lines[0] and "give --ownership local" in lines[0]
    assert not (tmp_path / "run").exists()
    with socket.socket(socket.AF_UNIX) as listener:  # the kubelet's socket: the daemon starts, kubelet ownership
        listener.bind(str(kubelet))
        daemon = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert daemon.stdout is not None and '"ready"' in daemon.stdout.readline()
            status, health = call(str(sock), "GET", "/healthz")
            assert status == 200 and health["ownership"] == "kubelet"
        finally:
            daemon.terminate()
            daemon.wait(30)


def test_nvml_backend_without_a_driver_says_so(tmp_path) -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pytest.skip("a real NVIDIA driver is present")
    except pynvml.NVMLError:
        pass
    result = CliRunner().invoke(main, ["--backend", "nvml", "--ownership", "local", "--socket",
                                       str(tmp_path / "c.sock"), "--state-file", str(tmp_path / "state.json")])
    assert result.exit_code != 0 and "cannot start with backend 'nvml'" in result.output


@pytest.mark.slow
def test_tcp_and_metrics_listeners(tmp_path) -> None:
    tcp, metrics = free_port(), free_port()
    proc = daemon_process(str(tmp_path / "c.sock"), "--tcp", f"127.0.0.1:{tcp}", "--metrics-port", str(metrics))
    try:
        gpus = json.load(urllib.request.urlopen(f"http://127.0.0.1:{tcp}/v1/gpus", timeout=5))["gpus"]
        assert len(gpus) == 4
        health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=5))
        assert health["ok"] is True
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        assert "envpipe_clockd_sm_clock_hertz" in text
        with pytest.raises(urllib.error.HTTPError) as exc:  # the metrics port serves no clock API
            urllib.request.urlopen(f"http://127.0.0.1:{metrics}/v1/gpus", timeout=5)
        assert exc.value.code == 404
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"


@pytest.fixture()
def nvml(monkeypatch):
    """The fake pynvml as the process's pynvml, with a GPU locked low that no failed start may touch."""
    from benchmarks.clockd_study.fake_pynvml import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(A, sm_mhz=1005)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def tree(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files}


def busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--socket-mode", "-1"], "--socket-mode"),
        (["--socket-mode", "1000000"], "--socket-mode"),
        (["--tcp", "127.0.0.1:99999"], "port"),
        (["--tcp", "127.0.0.1:0"], "port"),
        (["--socket", "TMP/file/c.sock"], "not a directory"),
        (["--socket", "TMP/" + "x" * 120 + ".sock"], "too long"),
        (["--socket", "/proc/envpipe-test/c.sock"], "/proc/envpipe-test"),
        (["--socket", "TMP/new/dir/c.sock", "--tcp", "127.0.0.1:BUSY"], "in use"),
        (["--socket", "TMP/new/dir/c.sock", "--metrics-port", "BUSY"], "in use"),
        (["--socket", "TMP/new/c.sock", "--state-file", "/proc/envpipe-test/state.json"], "--state-file"),
        (["--socket", "TMP/new/c.sock", "--state-file", "TMP"], "--state-file"),
    ],
)
def test_a_failed_start_is_one_line_touches_no_gpu_and_leaves_nothing_behind(tmp_path, nvml, args, message) -> None:
    (tmp_path / "file").write_text("not a directory")
    with busy_port() as busy:
        port = str(busy.getsockname()[1])
        args = [a.replace("TMP", str(tmp_path)).replace("BUSY", port) for a in args]
        if "--socket" not in args:
            args += ["--socket", str(tmp_path / "c.sock")]
        if "--state-file" not in args:  # the nvml backend needs one (test below)
            args += ["--state-file", str(tmp_path / "new" / "state.json")]
        before = tree(tmp_path)
        result = CliRunner().invoke(main, ["--backend", "nvml", "--ownership", "local", *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and message in lines[-1] and len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert nvml.gpus[0].calls == [] and nvml.gpus[0].sm_mhz == 1005
    assert tree(tmp_path) == before


def test_a_corrupt_state_file_resets_every_gpu_and_says_so(tmp_path, nvml, caplog) -> None:
    from tests.support.clockd_helpers import daemon_thread

    state = tmp_path / "state.json"
    state.write_text("{not json")
    from envpipe.clock.backends import NvmlBackend
    from envpipe.clock.state import StateFile

    with daemon_thread(str(tmp_path / "c.sock"), backend=NvmlBackend(nvml), state=StateFile(str(state))):
        assert nvml.gpus[0].sm_mhz == 1980
    assert any("state" in r.getMessage() and "every GPU" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
    reason="the client runs as another user (needs root) with a Python that user can run",
)
def test_socket_group_admits_a_non_root_member_and_nobody_else(tmp_path) -> None:
    """The chart's contract: socket 0660 root:<socket GID>; a uid-1000 pod with that supplemental group
    connects, the same uid without it is refused (as the runtime image's user is, without the group)."""
    home = Path(tempfile.mkdtemp(prefix="envpipe-sock-", dir="/tmp"))  # pytest's tmp_path is 0700 all the way
    home.chmod(0o755)  # the client user must reach the socket's directory
    sock = home / "c.sock"
    proc = daemon_process(str(sock), "--socket-group", "2500", "--socket-mode", "660")
    try:
        st = sock.stat()
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (2500, 0o660)
        connect = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
        probe = ["/usr/bin/python3", "-c", connect, str(sock)]
        member = subprocess.run(probe, user=1000, group=1000, extra_groups=[2500], capture_output=True, text=True)
        stranger = subprocess.run(probe, user=1000, group=1000, extra_groups=[], capture_output=True, text=True)
        assert member.returncode == 0, member.stderr
        assert stranger.returncode != 0 and "Permission denied" in stranger.stderr
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
        shutil.rmtree(home)


def test_every_option_says_what_it_does() -> None:
    """`envpipe-clockd --help` leaves no option unexplained."""
    import click

    from envpipe.clock.daemon import main

    assert [p.opts for p in main.params if isinstance(p, click.Option) and not p.help and not p.hidden] == []

"""The envpipe-clockd command line: bad flags fail clearly; TCP and metrics listeners serve."""

from __future__ import annotations

import json
import urllib.request

import pytest
from click.testing import CliRunner

from envpipe.clock.daemon import main
from tests.clockd_helpers import daemon_process
from tests.ports import free_port


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
    ],
)
def test_bad_flags_fail_with_a_clear_message(args, message, tmp_path) -> None:
    result = CliRunner().invoke(
        main, [*args, "--socket", str(tmp_path / "c.sock")] if "--socket" not in args else args
    )
    assert result.exit_code != 0 and message in result.output
    assert not (tmp_path / "c.sock").exists()


def test_nvml_backend_without_a_driver_says_so(tmp_path) -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pytest.skip("a real NVIDIA driver is present")
    except pynvml.NVMLError:
        pass
    result = CliRunner().invoke(main, ["--backend", "nvml", "--socket", str(tmp_path / "c.sock")])
    assert result.exit_code != 0 and "cannot start with backend 'nvml'" in result.output


@pytest.mark.slow
def test_tcp_and_metrics_listeners(tmp_path) -> None:
    tcp, metrics = free_port(), free_port()
    proc = daemon_process(
        str(tmp_path / "c.sock"), "--tcp", f"127.0.0.1:{tcp}", "--metrics-port", str(metrics)
    )
    try:
        gpus = json.load(urllib.request.urlopen(f"http://127.0.0.1:{tcp}/v1/gpus", timeout=5))["gpus"]
        assert len(gpus) == 4
        health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=5))
        assert health["ok"] is True
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        assert "envpipe_clockd_sm_clock_mhz" in text
        with pytest.raises(urllib.error.HTTPError) as exc:  # the metrics port serves no clock API
            urllib.request.urlopen(f"http://127.0.0.1:{metrics}/v1/gpus", timeout=5)
        assert exc.value.code == 404
    finally:
        proc.terminate()
        proc.wait(10)

"""The CLI: bad input, the local backend for real (2 CPU processes), no torch/deepspeed on import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from envpipe_launch.cli import main

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0", __file__], "--nodes must be >= 1"),
        (["--backend", "slurm", __file__], "unknown backend 'slurm'"),
        (["missing_script.py"], "training script not found: missing_script.py"),
        (["--nodes", "2", __file__], "the local backend runs one node"),
        (["--gpus-per-node", "0", __file__], "needs --gpus-per-node >= 1"),
        (["--backend", "ssh", "--nodes", "2", __file__], "exactly one of --hosts or --hostfile"),
        (["--backend", "ssh", "--nodes", "3", "--hosts", "a,b", __file__], "--nodes 3 but only 2 host"),
        (["--launcher", "srun", __file__], "unknown DeepSpeed launcher"),
        (["--env", "NOEQUALS", __file__], "--env expects KEY=VALUE"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("envpipe-launch: error: ") and message in r.output


def test_import_pulls_no_torch_or_deepspeed() -> None:
    code = (
        "import sys, envpipe_launch.cli, envpipe_launch.backends.kube, envpipe_launch.backends.cml, "
        "envpipe_launch.backends.ssh, envpipe_launch.backends.local; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True)


@pytest.mark.slow
def test_local_backend_runs_two_cpu_processes(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "envpipe_launch",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            str(ROOT / "tests" / "ds_pipe_cpu.py"),
            str(tmp_path),
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = sorted(p.read_text().split() for p in tmp_path.glob("rank*.txt"))
    assert [x[1] for x in ranks] == ["0", "1"] and {x[3] for x in ranks} == {"2"}


@pytest.mark.slow
def test_local_backend_passes_the_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(7)\n")
    r = subprocess.run(
        [sys.executable, "-m", "envpipe_launch", "--gpus-per-node", "1", str(script)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 7, r.stderr[-2000:]

"""The CLI: one clear line for bad input, help and choices, the local backend for real (CPU processes),
no torch/deepspeed on import."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from envpipe_launch import __version__, deepspeed_cmd, net
from envpipe_launch.cli import main
from envpipe_launch.errors import LaunchError, one_line
from envpipe_launch.job import DEFAULT_MASTER_PORT, job_name

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
KUBE = ["--backend", "kube", "--image", "registry.example/envpipe-runtime:1", "--dry-run"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0", __file__], "Invalid value for '--nodes': 0 is not in the range 1<=x<=4096"),
        (["--backend", "slurm", __file__], "'slurm' is not one of 'local', 'ssh', 'kube', 'cml'"),
        (["missing_script.py"], "training script not found: missing_script.py"),
        (["/dev/null"], "training script /dev/null: not a regular file"),
        (["--nodes", "2", __file__], "the local backend runs one node"),
        (["--gpus-per-node", "0", __file__], "needs --gpus-per-node >= 1"),
        (["--backend", "ssh", "--nodes", "2", __file__], "exactly one of --hosts or --hostfile"),
        (["--backend", "ssh", "--nodes", "3", "--hosts", "a,b", __file__], "--nodes 3 but only 2 host"),
        (["--launcher", "srun", __file__], "'srun' is not one of 'pdsh', 'openmpi', 'mvapich'"),
        (["--env", "NOEQUALS", __file__], "Invalid value for '--env': expected KEY=VALUE"),
        ([*KUBE, "--env", "NOEQ", "train.py"], "Invalid value for '--env': expected KEY=VALUE"),
        (["--env", "A=1\nB=2", __file__], "the value of A must be one line"),
        (["--master-port", "99999", __file__], "'--master-port': 99999 is not in the range 1<=x<=65535"),
        (["--ssh-port", "0", __file__], "'--ssh-port': 0 is not in the range 1<=x<=65535"),
        (["--connect-timeout", "-5", __file__], "'--connect-timeout': '-5' is not a number of seconds in (0, 86400]"),
        (["--connect-timeout", "nan", __file__], "'--connect-timeout': 'nan' is not a number of seconds"),
        (["--ready-timeout", "inf", __file__], "'--ready-timeout': 'inf' is not a number of seconds"),
        (["--stop-timeout", "-1", __file__], "'--stop-timeout': '-1' is not a number of seconds in [0, 86400]"),
        (["--backend", "ssh", "--hostfile", "/dev/zero", __file__], "'--hostfile': '/dev/zero' is not a regular file"),
        (["--backend", "ssh", "--hostfile", "/nonexistent", __file__], "'/nonexistent': No such file or directory"),
        (["--ssh-key", "/tmp", __file__], "'--ssh-key': '/tmp' is not a regular file"),
        (["--master-addr", "a b", __file__], "'--master-addr': 'a b': a host name or IPv4 address"),
        ([*KUBE, "--image", "Bad Image!!", "t.py"], "'--image': 'Bad Image!!': not an image reference"),
        ([*KUBE, "--namespace", "Bad NS", "t.py"], "'--namespace': 'Bad NS': a namespace is 1-63 lowercase"),
        ([*KUBE, "--name", "My_Job", "t.py"], "'--name': 'My_Job': a job name is 1-50 lowercase letters"),
        ([*KUBE, "--name", "1job", "t.py"], "starting with a letter"),
        (["--worker-memory", "0", __file__], "'--worker-memory': 0 is not in the range 1<=x<=65536"),
        (["--frobnicate", __file__], "No such option '--frobnicate'"),
        ([], "Missing argument 'SCRIPT'"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith("envpipe-launch: error: ") and message in r.stderr


def test_a_name_is_refused_not_renamed() -> None:
    assert job_name("envpipe", "a1b2c3") == "envpipe-a1b2c3"
    assert job_name("my-job", "") == "my-job"
    with pytest.raises(LaunchError, match="job name 'My_Job'"):
        job_name("My_Job", "")  # the old code made it "my-job" without a word


def test_control_characters_and_huge_values_stay_one_line() -> None:
    r = CliRunner().invoke(main, ["--nodes", "1\n2\x1b[31m", __file__])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "\\x1b" in r.stderr
    r = CliRunner().invoke(main, ["--hosts", "x" * 100_000, "--backend", "ssh", __file__])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and len(r.stderr) < 500
    assert one_line("a\udcffb") == "a\\udcffb"  # an undecodable argv byte


def test_every_option_has_help_and_choices_are_listed() -> None:
    options = [p for p in main.params if isinstance(p, click.Option)]
    assert all(p.help for p in options), [p.name for p in options if not p.help]
    text = CliRunner().invoke(main, ["--help"]).output
    assert "--backend [local|ssh|kube|cml]" in text and "--launcher [pdsh|openmpi|mvapich]" in text
    assert "SCRIPT_ARGS" in text and "128 + the signal" in text


def test_version() -> None:
    r = subprocess.run([sys.executable, "-m", "envpipe_launch", "--version"], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == f"envpipe-launch, version {__version__}\n"


@pytest.mark.parametrize("launcher", ["pdsh", "openmpi"])
def test_ssh_without_the_launchers_tools_is_one_line(launcher: str, tmp_path: Path, monkeypatch) -> None:
    # one host: DeepSpeed itself would not need pdsh (it ran the job here), so the old code never noticed
    monkeypatch.setenv("PATH", str(tmp_path))
    r = CliRunner().invoke(main, ["--backend", "ssh", "--launcher", launcher, "--hosts", "127.0.0.1", __file__])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"envpipe-launch: error: --launcher {launcher} needs " in r.stderr and "not found on PATH" in r.stderr


@pytest.mark.parametrize(
    ("launcher", "value", "why"),
    [("pdsh", " x", "white space"), ("pdsh", "x\u2003", "white space"), ("openmpi", "a b", "double quotes"),
     ("openmpi", "$HOME", "double quotes")],
)
def test_env_values_deepspeed_would_change_on_other_hosts_are_refused(launcher: str, value: str, why: str,
                                                                      tmp_path: Path, monkeypatch) -> None:
    """What no quoting carries (DeepSpeed strips exported values; mpirun keeps its quotes); with pdsh a value
    with $ ` " \\ is quoted instead (tests/launch/test_words.py)."""
    for tool in ("pdsh", "ompi_info", "mpirun"):
        (tmp_path / tool).write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    r = CliRunner().invoke(main, ["--backend", "ssh", "--launcher", launcher, "--hosts", "127.0.0.1",
                                  "--env", f"A={value}", __file__])
    assert r.exit_code == 2 and r.stderr.startswith(f"envpipe-launch: error: --env A={value!r}: "), r.output
    assert why in r.stderr and r.stderr.count("\n") == 1


def test_without_deepspeed_here_a_backend_that_needs_it_is_one_line(monkeypatch) -> None:
    monkeypatch.setattr(deepspeed_cmd, "RUNNER_PACKAGE", "envpipe_no_such_module")
    for args in ([__file__], ["--backend", "ssh", "--hosts", "127.0.0.1", __file__]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
        assert "runs DeepSpeed's launcher with this Python" in r.stderr and "no envpipe_no_such_module" in r.stderr


def test_master_port_is_a_free_one_here_and_the_default_elsewhere() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = {net.master_port(None, "127.0.0.1") for _ in range(20)}
        assert taken not in ports
    assert net.master_port(None, "192.0.2.1") == DEFAULT_MASTER_PORT  # TEST-NET-1: not this machine
    assert net.master_port(4242, "127.0.0.1") == 4242


def test_import_pulls_no_torch_or_deepspeed() -> None:
    code = (
        "import sys, envpipe_launch.cli, envpipe_launch.backends.kube, envpipe_launch.backends.cml, "
        "envpipe_launch.backends.ssh, envpipe_launch.backends.local; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True)


@pytest.fixture
def port_29500_taken():
    """Another job's rendezvous on DeepSpeed's default port (the old fixed port collided with it)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", DEFAULT_MASTER_PORT))
            s.listen()
        except OSError:
            pass  # taken already: by another job, which serves the test as well
        yield


@pytest.mark.slow
def test_local_backend_runs_two_cpu_processes(tmp_path: Path, port_29500_taken) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "envpipe_launch", "--nodes", "1", "--gpus-per-node", "2",
         "--env", "ENVPIPE_TEST_MARK=from --env", str(ROOT / "tests" / "support" / "ds_pipe_cpu.py"), str(tmp_path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = sorted(p.read_text().split() for p in tmp_path.glob("rank*.txt"))
    assert [x[1] for x in ranks] == ["0", "1"] and {x[3] for x in ranks} == {"2"}
    # --env reaches the ranks (DeepSpeed's single-host path reads no env file: the old code lost it)
    assert {" ".join(x[8:]) for x in ranks} == {"mark from --env"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.txt", "rank1.txt"]  # nothing else left


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

"""Arguments are data (envpipe_launch.words): what the user typed reaches a rank on another host as the same
bytes, through DeepSpeed's own runner code (imported here: PDSHRunner, add_export, runner.main), a pdsh that
does what pdsh over ssh does (tests/support/fakes/pdsh.py: `%` formats, `bash -c` in a login's
environment) and a bash; nothing the user typed runs as shell code (no canary file appears).

The round trips take any byte string but NUL (hypothesis, derandomized); the whole chain runs DeepSpeed's
runner in-process up to the point where it starts pdsh, then the fake pdsh and DeepSpeed's per-node
launcher's stand-in (tests/support/fakes/ds_launch.py: launch.py imports torch) on this machine. The slow test
runs the same through the real CLI, the real runner and the real launch.py.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from envpipe_launch import deepspeed_cmd, words
from envpipe_launch.backends import kube
from envpipe_launch.cli import main as launch_main
from envpipe_launch.errors import LaunchError
from envpipe_launch.job import JobSpec
from envpipe_launch.kube_manifests import PLAIN_WORKDIR
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fakes import ds_launch, pdsh
from tests.support.fakes.kubelet import kubelet_expand
from tests.support.hostile import HostileJob

ROOT = Path(__file__).resolve().parents[2]
ds_runner = pytest.importorskip("deepspeed.launcher.runner")
from deepspeed.launcher.multinode_runner import PDSHRunner  # noqa: E402  (after the skip: needs deepspeed)

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None)
# Any bytes but NUL (argv cannot hold it: refused below), as Python holds argv (undecodable bytes as surrogates)
BYTES = st.binary(max_size=24).filter(lambda b: b"\0" not in b).map(os.fsdecode)
SHELLISH = st.text(alphabet=" \t\n'\"\\$`*?[]{}~#!&|;<>()%hun=", max_size=16)
WORD = st.one_of(BYTES, SHELLISH)


def _args(user_args: list[str]) -> argparse.Namespace:
    """DeepSpeed's runner's own arguments, parsed by its own parser."""
    return ds_runner.parse_args(["--hostfile", "/h", "--launcher", "pdsh", "x.py", *user_args])


def _remote_shell(command: str) -> bytes:
    """What a host's shell prints for `command` after pdsh (host h0, rank 0)."""
    out = subprocess.run(["bash", "-c", pdsh.pdsh_format(command, "h0", "u", 0)], capture_output=True, check=True)
    return out.stdout


@SETTINGS
@given(st.lists(WORD, max_size=6))
def test_arguments_reach_the_remote_printf_unchanged(args: list[str]) -> None:
    """words.argument, then DeepSpeed's PDSHRunner.parse_user_args, pdsh, bash: printf sees the same bytes."""
    ds_words = PDSHRunner(_args([words.argument(a) for a in args]), "wi").user_arguments
    printed = _remote_shell(" ".join([words.shell_word("printf"), words.shell_word("%s\\0"), "-", *ds_words]))
    assert printed.split(b"\0")[1:-1] == [os.fsencode(a) for a in args]


@SETTINGS
@given(WORD)
def test_a_script_path_reaches_the_remote_shell_unchanged(script: str) -> None:
    """words.shell_word: DeepSpeed passes the script as it is."""
    assert _remote_shell(f"printf %%s {words.shell_word(script)}") == os.fsencode(script)


@SETTINGS
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=24))
def test_env_values_reach_the_remote_export_unchanged(value: str) -> None:
    """words.env_file, read as DeepSpeed's runner reads it (split at the first '=', add_export), exported
    by the command line PDSHRunner.get_cmd builds, through pdsh and bash."""
    why = words.value_error(value, words.PDSH)
    if why is not None:
        with pytest.raises(LaunchError, match="K="):
            words.env_file({"K": value}, words.PDSH)
        return
    runner = PDSHRunner(_args([]), "wi")
    # runner.main's reading of the env file: open(path, 'r').readlines() (universal newlines), split at '='
    for line in io.StringIO(words.env_file({"K": value}, words.PDSH), newline=None).readlines():
        key, val = line.split("=", maxsplit=1)
        runner.add_export(key, val)
    cmd, _, _ = runner.get_cmd({}, {"h0": [0]})
    exports = cmd[cmd.index("-w") + 2]
    assert _remote_shell(f'{exports}printf %%s "$K"') == value.encode()


def test_what_no_quoting_carries_is_one_line() -> None:
    with pytest.raises(LaunchError, match="NUL"):
        words.argument("a\0b")
    for value, why in [("a\nb", "line break"), (" x", "white space"), ("x\u2003", "white space")]:
        assert why in (words.value_error(value, words.PDSH) or "")
    assert "double quotes" in (words.value_error("a b", words.OPENMPI) or "")
    assert words.value_error("a b $x", words.PDSH) is None  # pdsh: quoted here, so anything on one line goes


@pytest.fixture
def job(tmp_path: Path) -> HostileJob:
    return HostileJob.make(tmp_path)


def test_hostile_words_reach_the_ranks_through_deepspeeds_runner(job: HostileJob, tmp_path, monkeypatch) -> None:
    """The ssh backend's command line through DeepSpeed's runner.main (in-process, until it starts pdsh),
    the fake pdsh and launch.py's stand-in: script, arguments, working directory and --env values arrive
    unchanged, PYTHONPATH is the one DeepSpeed gives, no shell code runs."""
    monkeypatch.setenv("PATH", f"{pdsh.install(tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", "/lib dir")
    monkeypatch.chdir(job.cwd)
    spec = JobSpec(nodes=1, gpus_per_node=2, script=job.script, script_args=job.args, backend="ssh",
                   env=[f"{k}={v}" for k, v in job.env.items()])
    deepspeed_cmd.check_multi_node(spec)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=2\n")
    argv = deepspeed_cmd.deepspeed_argv(spec, str(hostfile), "127.0.0.1", remote_cwd=str(job.cwd))
    env = deepspeed_cmd.ssh_env(None)
    deepspeed_cmd.write_env_file(str(tmp_path), spec, env)
    started = _run_deepspeed_runner(argv, env, deepspeed_cmd.REMOTE_RUNNER_CWD, tmp_path, monkeypatch)
    assert started.returncode == 0, started.stderr[-2000:]
    job.check(f"{job.cwd}:/lib dir", local_ranks=(0, 1))


def _run_deepspeed_runner(argv: list[str], env: dict[str, str], cwd: str, tmp_path: Path, monkeypatch
                          ) -> subprocess.CompletedProcess[bytes]:
    """DeepSpeed's runner.main on `argv` (after `python -u -m deepspeed.launcher.runner`) in `cwd` with `env`,
    up to the pdsh command it starts; that command then runs here, with launch.py's stand-in where the
    command names this Python."""
    started: list[tuple[list[str], dict[str, str]]] = []

    class Started:
        returncode = 0

        def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
            started.append((cmd, env))

        def wait(self) -> int:
            return 0

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(os, "environ", dict(env))
    monkeypatch.setattr(ds_runner, "DEEPSPEED_ENVIRONMENT_NAME", env["DS_ENV_FILE"])  # read at its import
    monkeypatch.setattr(ds_runner.subprocess, "Popen", Started)
    monkeypatch.setattr(ds_runner.signal, "signal", lambda *a: None)
    monkeypatch.setattr(sys, "executable", str(ds_launch.install(tmp_path / "standin")))
    ds_runner.main(argv[argv.index("deepspeed.launcher.runner") + 1:])
    monkeypatch.undo()
    (cmd, pdsh_env), = started
    assert cmd[0] == "pdsh"
    return subprocess.run(cmd, env=pdsh_env, capture_output=True)


def test_the_kube_dry_run_holds_the_words_and_they_reach_the_ranks(job: HostileJob, tmp_path, monkeypatch) -> None:
    """--dry-run's Job: node 0's container args (the kubelet's $$ undone, then bash's words) are DeepSpeed's
    runner's, its ConfigMap's deepspeed_env the env file; through the same runner, pdsh and bash they reach
    the ranks unchanged (the working directory is the image's: here a plain one)."""
    job = job.utf8_only()
    script = str(job.cwd / job.script)
    r = CliRunner().invoke(launch_main, ["--backend", "kube", "--image", "img:1", "--name", "t", "--dry-run",
                                         *job.env_options(), "--", script, *job.args])
    assert r.exit_code == 0, r.output
    docs = list(yaml.safe_load_all(r.stdout))
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    (container,) = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]["containers"]
    node0 = [kubelet_expand(a, {}) for a in container["args"]]
    assert node0[:3] == ["node", "bash", "-c"]
    wait, found, ds = node0[3].partition(f"; {PLAIN_WORKDIR}; exec ")
    assert wait.startswith("deadline=") and found and ds.startswith("deepspeed ")
    runner_argv = shlex.split(ds)
    (tmp_path / "hostfile").write_text("127.0.0.1 slots=1\n")
    runner_argv[runner_argv.index("--hostfile") + 1] = str(tmp_path / "hostfile")
    (tmp_path / "deepspeed_env").write_text(config["deepspeed_env"])
    monkeypatch.setenv("PATH", f"{pdsh.install(tmp_path / 'bin')}:{os.environ['PATH']}")
    env = {**os.environ, "PYTHONPATH": "/lib", "DS_ENV_FILE": str(tmp_path / "deepspeed_env")}
    workdir = tmp_path / "workdir"  # the image's
    workdir.mkdir()
    started = _run_deepspeed_runner(["deepspeed.launcher.runner", *runner_argv[1:]], env, str(workdir),
                                    tmp_path, monkeypatch)
    assert started.returncode == 0, started.stderr[-2000:]
    job.check(f"{workdir}:/lib", cwd=workdir, script=script)
    # an image whose working directory the runner would send unquoted: node 0 stops with one line
    refused = subprocess.run(["bash", "-c", PLAIN_WORKDIR], cwd=job.cwd, capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "would reach" in refused.stderr
    assert not job.canary.exists()


def test_kube_refuses_what_its_objects_cannot_hold(capsys) -> None:
    opts = kube.KubeOptions(image="img:1", name="t", dry_run=True)
    for spec, what in [
        (JobSpec(1, 1, "t.py", script_args=[os.fsdecode(b"\xff")], backend="kube", script_on_workers=True), "UTF-8"),
        (JobSpec(1, 1, "t.py", env=["A= x"], backend="kube", script_on_workers=True), "white space"),
    ]:
        with pytest.raises(LaunchError, match=what):
            kube.launch(spec, opts)
    assert capsys.readouterr().out == ""
    # --no-ssh: the values are the container's env, not a shell's
    spec = JobSpec(1, 1, "t.py", env=["A= x"], backend="kube", script_on_workers=True)
    assert kube.launch(spec, kube.KubeOptions(image="img:1", name="t", no_ssh=True, dry_run=True)) == 0


def test_environment_variables_deepspeed_exports_itself_are_checked_too(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{pdsh.install(tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.setenv("NCCL_DEBUG_FILE", "/tmp/nccl.%h.$USER")
    spec = JobSpec(1, 1, __file__, backend="ssh")
    with pytest.raises(LaunchError, match=r"NCCL_DEBUG_FILE=.*of this environment.*--env instead"):
        deepspeed_cmd.check_multi_node(spec)
    deepspeed_cmd.check_multi_node(JobSpec(1, 1, __file__, backend="ssh", env=["NCCL_DEBUG_FILE=/x/%h"]))


@pytest.mark.slow
def test_hostile_words_through_the_cli_and_deepspeeds_own_launcher(job: HostileJob, tmp_path) -> None:
    """The ssh backend for real but for ssh: envpipe-launch, DeepSpeed's runner and launch.py as processes,
    the fake pdsh in between (a listening port stands in for the host's sshd). tests/launch/test_ssh.py runs
    the same job over real pdsh, ssh and sshd between network namespaces."""
    path = f"{pdsh.install(tmp_path / 'bin')}:{os.environ['PATH']}"
    env = dict(os.environ, PATH=path, PYTHONPATH=f"{ROOT}:{ROOT / 'launcher'}")
    with socket.socket() as sshd:
        sshd.bind(("127.0.0.1", 0))
        sshd.listen()
        argv = [sys.executable, "-m", "envpipe_launch", "--backend", "ssh", "--hosts", "127.0.0.1", "--ssh-port",
                str(sshd.getsockname()[1]), *job.env_options(), "--", job.script, *job.args]
        r = subprocess.run(argv, env=env, cwd=job.cwd, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    job.check(f"{job.cwd}:{ROOT}:{ROOT / 'launcher'}")

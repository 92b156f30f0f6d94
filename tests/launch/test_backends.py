"""Every backend is a `Backend`: its own options read from the parsed command line, and one `launch(spec, opts)`."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from click.testing import CliRunner
from envpipe_launch import cli
from envpipe_launch.backends import backend
from envpipe_launch.backends.kube import KubeOptions
from envpipe_launch.backends.ssh import Reach, SshOptions
from envpipe_launch.command_line import CommandLine
from envpipe_launch.errors import LaunchError
from envpipe_launch.job import BACKENDS


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backend_reads_its_options_and_launches_a_spec_with_them(name: str) -> None:
    module = backend(name)
    assert list(inspect.signature(module.options).parameters) == ["args"]
    assert list(inspect.signature(module.launch).parameters) == ["spec", "opts"]


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'slurm'"):
        backend("slurm")


def parsed(*argv: str) -> CommandLine:
    """The command line as click hands it to main."""
    ctx = cli.main.make_context("envpipe-launch", list(argv))
    return CommandLine(**ctx.params)


def test_the_ssh_options_come_from_the_command_line(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("k")
    params = parsed("--backend", "ssh", "--hosts", "a,b", "--ssh-key", str(key), "--master-addr", "10.0.0.1",
                    "--connect-timeout", "3", "t.py")
    assert backend("ssh").options(params) == SshOptions("a,b", None, Reach(str(key), "10.0.0.1", 3.0))


def test_the_kube_options_come_from_the_command_line_checked() -> None:
    params = parsed("--backend", "kube", "--image", "img:1", "--dry-run", "--worker-cpu", "2", "t.py")
    opts = backend("kube").options(params)
    assert isinstance(opts, KubeOptions)
    assert (opts.image, opts.dry_run, opts.pods.cpu) == ("img:1", True, "2")
    with pytest.raises(LaunchError, match="--no-clockd conflicts"):
        backend("kube").options(parsed("--backend", "kube", "--no-clockd", "--clockd-gid", "7", "t.py"))


def test_main_dispatches_to_the_backend_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    class Fake:
        @staticmethod
        def options(params: object) -> str:
            return "opts"

        @staticmethod
        def launch(spec: object, opts: object) -> int:
            seen.append((getattr(spec, "backend", None), opts))
            return 7

    monkeypatch.setattr(cli, "backend", lambda name: Fake)
    result = CliRunner().invoke(cli.main, ["--backend", "kube", "t.py"])
    assert (result.exit_code, seen) == (7, [("kube", "opts")])

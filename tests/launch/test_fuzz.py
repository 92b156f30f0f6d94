"""Fuzzing envpipe-launch's option parsing: any argv ends in status 0 or in one clean line
`envpipe-launch: error: ...` (status 2), never a traceback, and leaves nothing behind: no file in the
working, temporary or home directory, no process.

Two parts, a few thousand cases in all: every single value of a pool of bad and edge values (by what
the option takes) on a working command line of every backend, so each one surely reaches the code
that must refuse it; then random command lines (hypothesis, derandomized: the same examples on every
run) of options, pool values, arbitrary text and arbitrary argv bytes.

The real CLI runs in-process, every backend included; only the two places where it would reach
outside are recorders: starting DeepSpeed (supervise.run) and waiting for a worker's sshd
(net.wait_for_port). Kubernetes has no configuration here (KUBECONFIG points nowhere), CML no session
(CDSW_IP_ADDRESS unset).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click
import psutil
import pytest
from click.testing import CliRunner
from envpipe_launch import net, supervise
from envpipe_launch.cli import main
from envpipe_launch.errors import MESSAGE_LIMIT
from envpipe_launch.job import BACKENDS, DS_LAUNCHERS
from envpipe_launch.kube_manifests import WORKLOADS
from envpipe_launch.params import EnvPair, RegularFile, Seconds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = 1500
_OPTS = [p for p in main.params if isinstance(p, click.Option)]
EAGER = [o for p in _OPTS if p.is_eager for o in p.opts]  # --help, --version: they end parsing at once
FLAGS = [o for p in _OPTS if p.is_flag and not p.is_eager for o in p.opts]
VALUED = [o for p in _OPTS if not p.is_flag for o in p.opts]
IMAGE = "registry.example/envpipe-runtime:1"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("inputs")
    (d / "train.py").write_text("print('never run')\n")
    (d / "hostfile").write_text("127.0.0.1 slots=2\n127.0.0.2 slots=2\n")
    (d / "binary").write_bytes(b"\xff\xfe\x00 slots=1\n")
    os.mkfifo(d / "fifo")  # opening it to read would block until a writer comes: never
    return {name: str(d / name) for name in ("train.py", "hostfile", "binary", "fifo")} | {"dir": str(d)}


def pools(inputs: dict[str, str]) -> dict[str, list[str]]:
    """Values worth trying, by what an option takes."""
    return {
        "number": ["0", "1", "-1", "-5", "nan", "inf", "1e308", "0.001", "86401", "65536", "4097", "257", "9" * 5000,
                   "", "1\n2", "١"],
        "path": [*inputs.values(), "/dev/zero", "/dev/null", "/nonexistent", "/", "/proc/self/status", "", "a\0b"],
        "env": ["A=1", "NOEQ", "A=$HOME", "A=x\ny", "A= b", "=1", "A=a b", "A=\"q\"", "É=1", "A=\udcff", "A=1=2"],
        "name": ["My_Job", "a" * 64, "ok-name", "Bad NS", "Bad Image!!", IMAGE, "img@sha256:ab", "1job", "a-", "ä"],
        "host": ["127.0.0.1", "127.0.0.1,127.0.0.2", "a,,b", "unknown", "a b", "node[1-3]", "x" * 300, "::1"],
        "choice": [*BACKENDS, *DS_LAUNCHERS, *WORKLOADS, "slurm", "LOCAL", "JobSet"],
        "other": ["--", "-", "-h", "$(HOME)", "x" * 1000],
    }


POOL_OF_TYPE = {EnvPair: "env", RegularFile: "path", Seconds: "number", click.IntRange: "number",
                click.Choice: "choice"}


def _pool(option: click.Option) -> str:
    if option.name in ("hosts", "master_addr"):
        return "host"
    return next((pool for t, pool in POOL_OF_TYPE.items() if isinstance(option.type, t)), "name")


def values(inputs: dict[str, str], pool: str | None = None) -> st.SearchStrategy[str]:
    """A value from `pool` (or from any pool), or arbitrary text, or arbitrary argv bytes."""
    every = pools(inputs)
    return st.one_of(
        st.sampled_from(every[pool] if pool else [v for vs in every.values() for v in vs]),
        st.text(max_size=12),
        st.binary(max_size=12).filter(lambda b: b"\0" not in b).map(os.fsdecode),  # argv bytes, any encoding
    )


def bases(inputs: dict[str, str]) -> list[list[str]]:
    """A working command line of each backend (and each way of the ssh and kube ones), without script."""
    return [
        ["--backend", "local"],
        ["--backend", "ssh", "--hosts", "127.0.0.1"],
        ["--backend", "ssh", "--nodes", "2", "--hostfile", inputs["hostfile"], "--env", "A=1"],
        ["--backend", "kube", "--image", IMAGE, "--dry-run"],
        ["--backend", "kube", "--image", IMAGE, "--no-ssh"],
        ["--backend", "kube", "--image", IMAGE, "--workload", "jobset", "--queue", "team-a", "--dry-run"],
        ["--backend", "cml", "--nodes", "2"],
    ]


def single_changes(inputs: dict[str, str]) -> list[list[str]]:
    every = pools(inputs)
    options = [p for p in _OPTS if not p.is_eager]
    changes = [[o] if p.is_flag else [o, v] for p in options for o in p.opts for v in every[_pool(p)]]
    return [[*base, *change, "--", inputs["train.py"]] for base in bases(inputs) for change in changes]


def argvs(inputs: dict[str, str]) -> st.SearchStrategy[list[str]]:
    value = values(inputs)
    anything = st.lists(st.one_of(st.sampled_from(FLAGS + VALUED), value), max_size=10)
    eager = st.tuples(anything, st.sampled_from(EAGER), anything).map(lambda t: [*t[0], t[1], *t[2]])
    options = {o: p for p in _OPTS if not p.is_flag for o in p.opts}
    pair = st.sampled_from(VALUED).flatmap(lambda o: values(inputs, _pool(options[o])).map(lambda v: [o, v]))
    flag = st.sampled_from(FLAGS).map(lambda f: [f])
    # a working command line, then option-value pairs (the last of an option wins), then a script
    structured = st.tuples(
        st.sampled_from(bases(inputs)), st.lists(st.one_of(pair, flag), max_size=4),
        st.sampled_from([inputs["train.py"], "t.py"]), st.lists(value, max_size=3),
    ).map(lambda t: [*t[0], *(x for part in t[1] for x in part), "--", t[2], *t[3]])
    kinds = {"anything": anything, "eager": eager, "structured": structured}
    return st.sampled_from(["anything", "eager"] + ["structured"] * 8).flatmap(kinds.__getitem__)


class Sandbox:
    """Where the CLI runs: empty working, temporary and home directories it must leave empty."""

    def __init__(self, inputs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inputs, self.started = inputs, []
        monkeypatch.setattr(supervise, "run",
                            lambda argv, env=None, stop_timeout_s=0, cwd=None: self.started.append(argv) or 0)
        monkeypatch.setattr(net, "wait_for_port", lambda host, port, timeout_s: None)
        self.dirs = [tmp_path / d for d in ("work", "temp", "home")]
        for d in self.dirs:
            d.mkdir()
        monkeypatch.chdir(self.dirs[0])
        monkeypatch.setattr(tempfile, "tempdir", str(self.dirs[1]))
        monkeypatch.setenv("HOME", str(self.dirs[2]))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
        for var in ("CDSW_IP_ADDRESS", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            monkeypatch.delenv(var, raising=False)
        self.inputs_before = set(os.listdir(inputs["dir"]))

    def check(self, argv: list[str]) -> None:
        r = CliRunner().invoke(main, argv)
        assert r.exception is None or isinstance(r.exception, SystemExit), (argv, r.exc_info)
        assert r.exit_code in (0, 2), (argv, r.output)
        if r.exit_code == 2:
            assert r.stdout == "", (argv, r.output)
            assert r.stderr.startswith("envpipe-launch: error: ") and r.stderr.count("\n") == 1, (argv, r.stderr)
            assert len(r.stderr) <= len("envpipe-launch: error: \n") + MESSAGE_LIMIT, argv
        assert all(os.listdir(d) == [] for d in self.dirs), argv
        assert set(os.listdir(self.inputs["dir"])) == self.inputs_before, argv
        assert psutil.Process().children() == [], argv


@pytest.fixture
def sandbox(inputs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    return Sandbox(inputs, tmp_path, monkeypatch)


def test_every_single_change_of_a_working_command_line(sandbox: Sandbox, inputs: dict[str, str]) -> None:
    cases = single_changes(inputs)
    for argv in cases:
        sandbox.check(argv)
    assert len(cases) > 1000 and len(sandbox.started) > 100  # the sweep reached DeepSpeed's start often


@pytest.mark.slow  # every single change of a working command line runs in the fast tier
def test_random_command_lines(sandbox: Sandbox, inputs: dict[str, str]) -> None:
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(argvs(inputs))
    def one(argv: list[str]) -> None:
        sandbox.check(argv)

    one()
    assert sandbox.started, "no example reached DeepSpeed's start: the strategies miss the valid paths"

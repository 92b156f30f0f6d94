"""Fuzzed `envpipe search` (hypothesis, derandomized: the same cases on every run): for mutated layer profiles,
special files and options, it either succeeds with finite numbers everywhere (stdout and every JSON file it
wrote, no NaN or Infinity) or fails with exit status != 0, exactly one line on stderr, no traceback and
nothing written; and never hangs (an alarm bounds every run). The quick tier runs a few dozen cases, the
slow one hundreds (ENVPIPE_FUZZ_SCALE scales both, as for the planner's fuzz)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envpipe.cli import main
from envpipe.plan.planfile import Plan
from tests.support.layer_profiles import layer_profile

SCALE = float(os.environ.get("ENVPIPE_FUZZ_SCALE", "1"))
NONFINITE = re.compile(r"(?i)(?<![a-z])(nan|inf|infinity)(?![a-z])")
HANG_S = 60
TRIED: dict[str, int] = {"runs": 0, "ok": 0, "refused": 0}
BASE = layer_profile([1.0, 3.0, 3.0, 2.0], params=[200_000] * 4, sizes=(1, 2)).to_json()


def fuzz(examples: int) -> settings:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


NASTY = [None, True, -1, 0, 1, 2.5, 1e308, -1e308, 10**18, 10**19, 1e-320, "", "x", [], {}, [1], {"a": 1}]
PATHS = [("version",), ("kind",), ("dtype",), ("device",), ("cpu_threads",), ("micro_batch_sizes",),
         ("micro_batch_sizes", 0), ("model", "layers"), ("model", "hidden"), ("model", "family"), ("power", "busy_w"),
         ("power", "idle_w"), ("clocks", "measured_mhz"), ("device_memory",), ("device_memory", "total_bytes"),
         ("device_memory", "outside_allocator_bytes"), ("layers",), ("layers", 1), ("layers", 2, "param_bytes"),
         ("layers", 0, "parameters"), ("layers", 3, "optimizer_step_s"), ("layers", 1, "per_micro_batch"),
         ("layers", 1, "per_micro_batch", "1", "forward_s"), ("layers", 2, "per_micro_batch", "2", "backward_host_s"),
         ("layers", 3, "per_micro_batch", "1", "output_bytes"), ("layers", 0, "per_micro_batch", "2",
                                                                   "forward_repeat_s")]
RAW = ["NaN", "Infinity", "-Infinity", "1e999", "1" + "0" * 5000, "deep", "truncate", "bom", "latin1", "empty"]
mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PATHS), st.sampled_from(NASTY)),
    st.tuples(st.just("delete"), st.sampled_from(PATHS)),
    st.tuples(st.just("raw"), st.sampled_from(RAW)),
)
SPECIAL = ["fifo", "/dev/zero", "directory", "missing", "huge"]

# option -> (values that should work, values a user might get wrong); None leaves the option out
OPTIONS: dict[str, tuple[list[str | None], list[str]]] = {
    "--nodes": ([None, "1", "2"], ["0", "-1", "4097", "9" * 30, "x", "1.5"]),
    "--gpus-per-node": (["2", "1", "4"], ["0", "65", "nan", "9" * 30]),
    "--global-batch": (["8", "4", "16"], ["0", "-8", "16777217", "1e3", "9" * 30]),
    "--memory-gib": (["4", "64", "2.5"], ["0", "-1", "nan", "inf", "-inf", "1e308", "1048577", "x"]),
    "--memory-margin-gib": ([None, "0", "0.5"], ["-1", "nan", "inf", "1e308", "64"]),
    "--top-k": ([None, "1", "3"], ["0", "1001", "9" * 30]),
    "--intra-node-gbps": ([None, "100", "3200"], ["0", "-1", "nan", "inf", "1e308"]),
    "--inter-node-gbps": ([None, "400"], ["0", "nan", "inf"]),
    "--allreduce-gbps": ([None, "1600"], ["0", "nan", "-5"]),
    "--latency-us": ([None, "0", "5.5"], ["-1", "nan", "inf", "1e308"]),
    "--communicator-mib": ([None, "0", "512.5"], ["-1", "nan", "inf", "1048577"]),
    "--max-plan-units": ([None, "0", "64"], ["-1", "131073", "9" * 30]),
    "--objective": ([None, "frontier"], ["bogus"]),
    "--out-dir": (["{d}/out", "{d}/a/b/out"], ["{file}", "{file}/out"]),
}


def options() -> st.SearchStrategy[dict[str, str | None]]:
    """Every option a working value, except at most two that get a wrong one."""
    def draw(wrong: set[str]) -> st.SearchStrategy[dict[str, str | None]]:
        return st.fixed_dictionaries({k: st.sampled_from(OPTIONS[k][1] if k in wrong else OPTIONS[k][0])
                                      for k in OPTIONS})
    return st.sets(st.sampled_from(sorted(OPTIONS)), max_size=2).flatmap(draw)


def profile_text(mutations: list[tuple[Any, ...]]) -> bytes:
    data = copy.deepcopy(BASE)
    raw = []
    for m in mutations:
        if m[0] == "raw":
            raw.append(m[1])
            continue
        *parents, last = m[1]
        node: Any = data
        with contextlib.suppress(KeyError, IndexError, TypeError):
            for key in parents:
                node = node[key]
            if m[0] == "set":
                node[last] = copy.deepcopy(m[2])
            else:
                del node[last]
    text = json.dumps(data, indent=1).encode()
    for op in raw:
        if op == "deep":
            text = b'{"layers": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        elif op == "truncate":
            text = text[: len(text) // 2]
        elif op == "bom":
            text = b"\xef\xbb\xbf" + text
        elif op == "latin1":
            text = text.replace(b'"gpt2"', b'"gpt\xe92"', 1)
        elif op == "empty":
            text = b""
        else:  # a number the JSON parser would make NaN, inf or a 5,000-digit integer
            text = re.sub(rb"\d+\.\d+", op.encode(), text, count=1)
    return text


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """A run that hangs (a FIFO opened for reading, say) fails the test instead of stalling the suite."""
    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError(f"envpipe search hung for {seconds} s")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check(args: list[str], workdir: Path) -> None:
    """The contract: success with finite output, or one line and nothing left behind; never a hang."""
    inputs = set(workdir.rglob("*"))
    TRIED["runs"] += 1
    with alarm(HANG_S):
        res = CliRunner().invoke(main, args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"traceback for {args}: {res.exception!r}") from res.exception
    made = {p for p in set(workdir.rglob("*")) - inputs if p.is_file()}
    assert not [p for p in set(workdir.rglob("*")) - inputs if p.name.startswith(".envpipe-search.")], args
    if res.exit_code == 0:
        TRIED["ok"] += 1
        assert not NONFINITE.search(res.stdout), (args, res.stdout)
        for path in made:
            if path.name.endswith(".plan.json"):
                Plan.load(path)
            if path.suffix == ".json":
                json.loads(path.read_text(), parse_constant=_refuse)
        return
    TRIED["refused"] += 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and len(lines[0]) < 400, (args, res.stderr[:2000])
    assert not made, (args, made, res.stderr)


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} written into a JSON file")


def _layers(d: Path, mutations: list[tuple[Any, ...]], special: str | None) -> str:
    if special == "fifo":
        os.mkfifo(d / "fifo")
        return str(d / "fifo")
    if special in ("/dev/zero", "missing"):
        return special if special == "/dev/zero" else str(d / "missing.json")
    if special == "directory":
        return str(d)
    path = d / "layers.json"
    path.write_bytes(b" " * (16 * 2**20 + 1) if special == "huge" else profile_text(mutations))
    return str(path)


def run_profiles(mutations: list[tuple[Any, ...]], special: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        layers = _layers(d, mutations, special)
        check(["search", "--layers", layers, "--gpus-per-node", "2", "--global-batch", "8", "--memory-gib", "8",
               "--out-dir", str(d / "out")], d)


def run_options(opts: dict[str, str | None]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "file").write_text("")
        layers = d / "layers.json"
        layers.write_bytes(profile_text([]))
        values = {k: v.format(d=d, file=d / "file") for k, v in opts.items() if v is not None}
        check(["search", "--layers", str(layers), *[a for kv in values.items() for a in kv]], d)


@fuzz(25)
@given(mutations=st.lists(mutation, max_size=2), special=st.sampled_from([None] * 6 + SPECIAL))
def test_fuzz_profiles_quick(mutations, special) -> None:
    run_profiles(mutations, special)


@fuzz(6)
@given(opts=options())
def test_fuzz_options_quick(opts) -> None:
    run_options(opts)


@pytest.mark.slow
@fuzz(400)
@given(mutations=st.lists(mutation, max_size=3), special=st.sampled_from([None] * 10 + SPECIAL))
def test_fuzz_profiles(mutations, special) -> None:
    run_profiles(mutations, special)


@pytest.mark.slow
@fuzz(200)
@given(opts=options())
def test_fuzz_options(opts) -> None:
    run_options(opts)


@pytest.fixture(scope="module", autouse=True)
def _both_outcomes_explored():
    """The fuzz is only worth something if it reaches both sides of the contract."""
    yield
    print(f"\nsearch CLI fuzz: {TRIED['runs']} runs, {TRIED['ok']} succeeded, {TRIED['refused']} refused in one "
          "line, 0 tracebacks, 0 hangs, no NaN or Infinity written")
    if TRIED["runs"] >= 30:
        assert TRIED["ok"] > TRIED["runs"] // 20 and TRIED["refused"] > TRIED["runs"] // 20, TRIED

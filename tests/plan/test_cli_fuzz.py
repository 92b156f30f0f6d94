"""Fuzzed planner CLI (hypothesis, derandomized: the same cases on every run): for mutated profiles, plans and
options, `envpipe plan` / `envpipe simulate` either succeed with finite numbers and readable files, or fail
with exit status != 0, exactly one line on stderr, no traceback and no output file left behind.

The mutations are the ones a user or a broken tool produces: bad cells, duplicated or missing columns and
rows, a BOM, CRLF, truncation, huge and non-finite numbers, wrong JSON types, deep nesting, impossible
sizes, and options out of range. tests/plan/test_core_cli.py holds one regression test per reported case.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envpipe.atomicfile import new_file_mode
from envpipe.cli import main
from envpipe.plan.planfile import Plan

SCALE = float(os.environ.get("ENVPIPE_FUZZ_SCALE", "1"))  # e.g. 0.1 for a quick local look


def fuzz(examples: int) -> settings:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))



HEADER = ["stage", "instruction", "frequency", "time", "energy"]
CLOCKS = (1410, 1200, 1005)
BASE_ROWS = [[str(s), kind, str(f), repr(t * 1410 / f), repr(e * (0.6 + 0.4 * f / 1410))]
             for s in range(2) for f in CLOCKS for kind, t, e in (("forward", 0.01 + 0.002 * s, 3.0),
                                                                   ("backward", 0.02 + 0.003 * s, 6.0))]
NONFINITE = re.compile(r"(?i)(?<![a-z])(nan|inf|infinity)(?![a-z])")
TRIED: dict[str, int] = {"runs": 0, "ok": 0, "refused": 0}

NASTY_CELLS = ["", " ", "nan", "NaN", "inf", "-inf", "1e307", "1e308", "1e309", "-1", "0", "-0", "1e-320", "5e-324",
               "1e9", "1000000000", "4294967296", "abc", "0x10", "1_000", "9" * 400, "1.5", " 7 ", "1410", "855",
               "forward", "backward", '"', "1,2", "１２", "\ufeff1", "F", "1" + "0" * 5000]
profile_mutation = st.one_of(
    st.tuples(st.just("cell"), st.integers(0, len(BASE_ROWS) - 1), st.integers(0, 4), st.sampled_from(NASTY_CELLS)),
    st.tuples(st.just("column"), st.integers(0, 4), st.sampled_from(["dup-same", "dup-other", "drop", "rename"])),
    st.tuples(st.just("scale"), st.integers(2, 4), st.sampled_from([0.0, -1.0, 1e-300, 1e300, 1e306, 3e3])),
    st.tuples(st.just("row"), st.integers(0, len(BASE_ROWS) - 1), st.sampled_from(["dup", "drop", "extra", "short"])),
    st.tuples(st.just("text"), st.sampled_from(["bom", "crlf", "blank", "nul", "latin1", "empty", "header-only"])),
    st.tuples(st.just("truncate"), st.floats(0.0, 1.0)),
)

JSON_NASTY = [True, False, None, 0, -1, 1, 2, 3, 1.5, 10**9, 10**30, 1e308, "F", "B", "x", "", [], {}, [[0, "F", 0]],
              {"kind": "F", "mb": 0, "freq_mhz": 1410}, "sha256:" + "0" * 64]
json_values = st.recursive(
    st.sampled_from(JSON_NASTY) | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["kind", "mb", "x"]), c, max_size=3),
    max_leaves=8,
)
PLAN_PATHS = [("version",), ("num_stages",), ("num_microbatches",), ("schedule",), ("policy",), ("stages",),
              ("stages", 0), ("stages", 1, 0), ("stages", 0, 2, "kind"), ("stages", 1, 3, "mb"),
              ("stages", 0, 1, "freq_mhz"), ("predicted",), ("predicted", "energy_j"), ("critical_path",),
              ("critical_path", 0), ("critical_path", 0, 2), ("profile_digest",), ("extra",)]
plan_mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PLAN_PATHS), json_values),
    st.tuples(st.just("delete"), st.sampled_from(PLAN_PATHS)),
    st.tuples(st.just("swap"), st.integers(0, 1), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("raw"), st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "1" + "0" * 5000,
                                               "deep", "deep-valid", "bom", "truncate", "latin1"])),
)

# option -> (values that should work, values a user might get wrong); None leaves the option out
OPTIONS: dict[str, tuple[list[str | None], list[str]]] = {
    "-m": (["3", "1", "2", "4"], ["0", "-1", "1e9", "65537", "x", "200000", "9" * 30]),
    "--stages": ([None, "2", "1", "3"], ["0", "1025", "-2", "nan", "40000"]),
    "--idle-power": (["80", "0", "1e-300", "10000", "80,90"], ["nan", "inf", "-inf", "1e308", "-3", "10001", "80,nan"]),
    "--tail-power": ([None, "300", "300,200"], ["nan", "-1", "10001", "x", "1,2,3"]),
    "--transfer-time": ([None, "0.001", "3600"], ["nan", "inf", "1e308", "-1", "3601"]),
    "--tail-time": ([None, "0.01", "0.01,0.02"], ["0.01,0.02,0.03", "nan", "-1", "1e308", ",", "0," * 2000, "x"]),
    "--threshold-scale": ([None, "4", "1e-300"], ["0", "-1", "nan", "inf", "1e7"]),
    "--memory-cap": ([None, "0", "1"], ["-1", "x", "99999999"]),
    "--schedule": ([None, "1f1b", "envpipe", "gpipe"], ["bogus"]),
    "--policy": ([None, "baseline", "uniform", "envelope"], ["bogus"]),
    "--reconfig": ([None, "default", "greedy", "balanced"], ["bogus"]),
    "--gpu": ([None, "all", "A40"], ["h300"]),
    "--max-slowdown": ([None, "0", "0.01", "5%", "0.5 %"], ["nan", "inf", "-1", "1", "5", "100%", "x%"]),
    "--time-budget": ([None, "0.2", "0.001", "1e9"], ["0", "nan", "1e308", "-1"]),
    "--time-limit": ([None, None, "30", "1e-6"], ["0", "-1", "nan", "inf", "3601"]),
    # matplotlib and LP sweeps cost more: drawn less often
    "--out": ([None, None, "{d}/p.json", "{d}/new/deeper/p.json"], ["{d}", "{file}/p.json", "{d}/"]),
    "--gantt": ([None] * 8 + ["{d}/g.png", "{d}/sub/g.svg"], ["{d}/g.pdf", "{file}/g.png"]),
    "--frontier": ([None] * 8 + ["{d}/fr/f.csv"], ["{d}/f.txt", "{file}/f.csv"]),
    "--frontier-points": ([None, "2", "3"], ["1", "1001", "x"]),
}
OPTIMAL_ONLY = ("--max-slowdown", "--time-budget", "--time-limit", "--frontier", "--frontier-points")
SIMULATE_OPTIONS = ("--stages", "--idle-power", "--tail-power", "--transfer-time", "--tail-time", "--gpu")


def options(names: tuple[str, ...], optimal: bool = False) -> st.SearchStrategy[dict[str, str | None]]:
    """Every option a working value, except at most two that get a wrong one (for EnvPipe's policies, an
    option of the optimal planner is a wrong one)."""
    good = {k: OPTIONS[k][0] if optimal or k not in OPTIMAL_ONLY else [None] for k in names}
    if optimal:
        good["--policy"] = ["optimal"]

    def draw(wrong: set[str]) -> st.SearchStrategy[dict[str, str | None]]:
        return st.fixed_dictionaries({k: st.sampled_from(OPTIONS[k][1] if k in wrong else good[k]) for k in names})
    return st.sets(st.sampled_from(sorted(names)), max_size=2).flatmap(draw)


def profile_text(mutations: list[tuple[Any, ...]]) -> bytes:
    header, rows = list(HEADER), [list(r) for r in BASE_ROWS]
    text_ops: list[Callable[[bytes], bytes]] = []
    for m in mutations:
        if m[0] == "cell":
            row = rows[m[1] % len(rows)]
            row[m[2] % len(row)] = m[3]
        elif m[0] == "column":
            col, how = m[1] % len(header), m[2]  # a column still there after an earlier drop
            if how == "drop":
                del header[col:col + 1]
                for r in rows:
                    del r[col:col + 1]
            elif how == "rename":
                header[col] = header[col].upper()
            else:
                header.append(header[col])
                for r in rows:
                    value = r[col] if col < len(r) else ""
                    with contextlib.suppress(ValueError):
                        value = value if how == "dup-same" or col < 3 else repr(3 * float(value))
                    r.append(value)
        elif m[0] == "scale":
            for r in rows:
                with contextlib.suppress(ValueError, IndexError):
                    r[m[1]] = repr(float(r[m[1]]) * m[2])
        elif m[0] == "row":
            i, how = m[1] % len(rows), m[2]
            if how == "dup":
                rows.insert(i, list(rows[i]))
            elif how == "drop" and len(rows) > 1:
                rows.pop(i)
            elif how == "extra":
                rows[i].append("1")
            elif how == "short":
                rows[i] = rows[i][:2]
        elif m[0] == "text":
            text_ops.append({
                "bom": lambda b: b"\xef\xbb\xbf" + b,
                "crlf": lambda b: b.replace(b"\n", b"\r\n"),
                "blank": lambda b: b.replace(b"\n", b"\n\n", 3),
                "nul": lambda b: b[:20] + b"\x00" + b[20:],
                "latin1": lambda b: b[:30] + b"\xe9" + b[30:],
                "empty": lambda b: b"",
                "header-only": lambda b: b.split(b"\n", 1)[0] + b"\n",
            }[m[1]])
        elif m[0] == "truncate":
            text_ops.append(lambda b, f=m[1]: b[: int(len(b) * f)])
    data = "\n".join(",".join(r) for r in [header, *rows]).encode() + b"\n"
    for op in text_ops:
        data = op(data)
    return data


def plan_text(base: dict[str, Any], mutations: list[tuple[Any, ...]]) -> bytes:
    data = copy.deepcopy(base)
    raw_ops = []
    for m in mutations:
        if m[0] in ("set", "delete"):
            *parents, last = m[1]
            node: Any = data
            try:
                for key in parents:
                    node = node[key]
                if m[0] == "set":
                    node[last] = copy.deepcopy(m[2])
                else:
                    del node[last]
            except (KeyError, IndexError, TypeError):
                pass
        elif m[0] == "swap":
            with contextlib.suppress(TypeError, IndexError, KeyError):
                units = data["stages"][m[1]]
                units[m[2]], units[m[3]] = units[m[3]], units[m[2]]
        else:
            raw_ops.append(m[1])
    text = json.dumps(data, indent=1).encode()
    for op in raw_ops:
        if op == "deep":
            text = b'{"stages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        elif op == "deep-valid":  # nested, but within Python's recursion limit
            text = text.replace(b'"predicted": {', b'"predicted": {"x": ' + b"[" * 500 + b"]" * 500 + b", ", 1)
        elif op == "bom":
            text = b"\xef\xbb\xbf" + text
        elif op == "truncate":
            text = text[: len(text) // 2]
        elif op == "latin1":
            text = text.replace(b'"envpipe"', b'"envpip\xe9"', 1)
        else:  # a number the JSON parser would turn into nan, inf or a 5,000-digit int
            text = re.sub(rb"\d+\.\d+", op.encode(), text, count=1)
    return text


def check(args: list[str], workdir: Path) -> None:
    """The contract: success with finite output and loadable files, or one line, no traceback, nothing left."""
    inputs = set(workdir.rglob("*"))
    TRIED["runs"] += 1
    res = CliRunner().invoke(main, args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"traceback for {args}: {res.exception!r}") from res.exception
    made = set(workdir.rglob("*")) - inputs
    assert not [p for p in made if p.name.endswith(".tmp")], (args, made)
    if res.exit_code == 0:
        TRIED["ok"] += 1
        assert not NONFINITE.search(res.stdout), (args, res.stdout)
        for path in made:
            if path.suffix == ".json":
                plan = Plan.load(path)
                assert all(abs(v) < float("inf") for v in plan.predicted.values())
                assert path.stat().st_mode & 0o777 == new_file_mode(), oct(path.stat().st_mode)
        return
    TRIED["refused"] += 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and len(lines[0]) < 400, (args, res.stderr[:2000])
    assert not made, (args, made, res.stderr)


@pytest.fixture(scope="module", autouse=True)
def _both_outcomes_explored():
    """The fuzz is only worth something if it reaches both sides of the contract."""
    yield
    print(f"\nplanner CLI fuzz: {TRIED['runs']} runs, {TRIED['ok']} succeeded, {TRIED['refused']} refused in one line")
    if TRIED["runs"] >= 300:  # the whole module ran, not one test picked out
        assert TRIED["ok"] > TRIED["runs"] // 20 and TRIED["refused"] > TRIED["runs"] // 20, TRIED


def _write(d: Path, name: str, data: bytes) -> str:
    path = d / name
    path.write_bytes(data)
    return str(path)


def _base_plan(d: Path) -> dict[str, Any]:
    profile = _write(d, "base.csv", profile_text([]))
    out = d / "base.json"
    res = CliRunner().invoke(main, ["plan", "--profile", profile, "-m", "3", "--idle-power", "80", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


with tempfile.TemporaryDirectory() as _d:
    BASE_PLAN = _base_plan(Path(_d))


@pytest.mark.slow  # profiles, plans and options: one fuzzer per input kind; options run in the fast tier
@fuzz(1000)
@given(mutations=st.lists(profile_mutation, max_size=3),
       policy=st.sampled_from(["envelope", "baseline", "uniform", "optimal"]), m=st.sampled_from(["1", "3"]))
def test_fuzz_profiles(mutations, policy, m) -> None:
    with tempfile.TemporaryDirectory() as d:
        profile = _write(Path(d), "p.csv", profile_text(mutations))
        out = Path(d) / "new" / "plan.json"
        check(["plan", "--profile", profile, "-m", m, "--idle-power", "80", "--policy", policy, "--out", str(out)],
              Path(d))


@pytest.mark.slow
@fuzz(1000)
@given(mutations=st.lists(plan_mutation, max_size=3), opts=options(SIMULATE_OPTIONS))
def test_fuzz_plans(mutations, opts) -> None:
    with tempfile.TemporaryDirectory() as d:
        profile = _write(Path(d), "p.csv", profile_text([]))
        plan = _write(Path(d), "plan.json", plan_text(BASE_PLAN, mutations))
        args = ["simulate", "--profile", profile, "--plan", plan]
        check(args + [a for k, v in opts.items() if v is not None for a in (k, v)], Path(d))


def _plan_with(opts: dict[str, str | None]) -> None:
    with tempfile.TemporaryDirectory() as d:
        blocker = Path(d) / "file"
        blocker.write_text("")
        profile = _write(Path(d), "p.csv", profile_text([]))
        values = {k: v.format(d=d, file=blocker) for k, v in opts.items() if v is not None}
        check(["plan", "--profile", profile, *[a for kv in values.items() for a in kv]], Path(d))


@fuzz(100)
@given(opts=options(tuple(OPTIONS)) | options(tuple(OPTIONS), optimal=True))
def test_fuzz_options(opts) -> None:
    _plan_with(opts)


@pytest.mark.slow  # 500 more command lines: about 25 s on the 2-core VM; the 100 above in the fast tier
@fuzz(500)
@given(opts=options(tuple(OPTIONS)) | options(tuple(OPTIONS), optimal=True))
def test_fuzz_options_at_length(opts) -> None:
    _plan_with(opts)

"""The envpipe-clockd study's one command: its subcommands, bad input in one line, the fair run's Markdown
rendered from its raw JSON. Nothing here runs a benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.clockd_results import SUBCOMMANDS
from benchmarks.common import RESULTS, ROOT
from tests.support.commands import run_script

SCRIPT = ROOT / "benchmarks" / "clockd_results.py"


def test_help_lists_every_subcommand(tmp_path: Path) -> None:
    proc = run_script(SCRIPT, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(SUBCOMMANDS) == ["fair", "fair-render", "faults", "latency", "readonly"]
    for name in SUBCOMMANDS:
        assert f"    {name} " in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["nope"], "invalid choice: 'nope'"),
    ([], "the following arguments are required"),
    (["latency", "--nope"], "unrecognized arguments: --nope"),
    (["fair", "--update", "--out", "x.md"], "not allowed with argument --update"),
    (["readonly"], "the following arguments are required: OUT.md"),
    (["fair-render", "missing.json"], "missing.json: No such file or directory"),
    (["fair-render", "bad.json"], "bad.json: not JSON (Expecting property name"),
    (["fair-render", str(RESULTS / "freqmodel.json")], "not a fair-service run's raw results (no clients"),
], ids=["subcommand", "no-subcommand", "option", "exclusive-options", "no-out", "missing-raw", "not-json",
        "not-a-fair-run"])
def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    proc = run_script(SCRIPT, *args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_fair_render_reproduces_the_committed_markdown(tmp_path: Path) -> None:
    proc = run_script(SCRIPT, "fair-render", str(RESULTS / "clockd_fair.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (RESULTS / "clockd_fair.md").read_text()

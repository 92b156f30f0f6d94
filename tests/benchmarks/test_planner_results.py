"""The planner study's one command, benchmarks/planner_results.py (issue #39): a subcommand per results file with
its benchmark's options, usage errors in one line, and a run whose file names the command line that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import planner_results
from benchmarks.common import ROOT
from benchmarks.planner_study import schedules
from tests.support.commands import run_script

SCRIPT = ROOT / "benchmarks" / "planner_results.py"
OPTIONS = {"policies": ["--update", "--out"], "optimal": ["--quick", "--update", "--out"],
           "scale": ["--reference", "--reference-timeout", "--quick", "--update", "--out"],
           "schedules": ["--microbatches", "--update", "--out"]}


def test_help_lists_the_four_subcommands(tmp_path: Path) -> None:
    proc = run_script(SCRIPT, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "{policies,optimal,scale,schedules}" in proc.stdout
    assert list(planner_results.SUBCOMMANDS) == list(OPTIONS)


@pytest.mark.parametrize("kind", OPTIONS)
def test_each_subcommand_keeps_its_benchmarks_options(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        planner_results.main([kind, "--help"])
    assert exc.value.code == 0
    shown = capsys.readouterr().out
    assert all(option in shown for option in OPTIONS[kind]), shown


def test_an_unknown_subcommand_is_one_line(tmp_path: Path) -> None:
    proc = run_script(SCRIPT, "nope", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("planner_results.py: error: argument {policies,optimal,scale,schedules}: "
                                  "invalid choice: 'nope'")


@pytest.mark.parametrize(("args", "message"), [
    ([], "the following arguments are required"),
    (["schedules", "--bogus"], "unrecognized arguments: --bogus"),
    (["schedules", "--microbatches", "12"], "12: give a multiple of 8 (the profiles' stages), at least 16"),
    (["schedules", "--update", "--out", "x.md"], "not allowed with argument --update"),
    (["scale", "--reference", "/nonexistent"], "/nonexistent: no envpipe package in it"),
    (["scale", "--reference-timeout", "0"], "0: give a number of seconds above 0"),
])
def test_bad_values_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        planner_results.main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_run_writes_its_file_and_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(schedules, "PROFILES", {"bloom+a40_bf16": 70.38})  # one profile, one schedule: a second
    monkeypatch.setattr(schedules, "ROWS", [("1F1B", "1f1b", None)])
    out = tmp_path / "schedules.md"
    assert planner_results.main(["schedules", "--microbatches", "16", "--out", str(out)]) == 0
    head = out.read_text().splitlines()[:3]
    assert head[0] == "# Pipeline schedules: time, bubble, memory, energy (simulated)"
    assert head[2].endswith(f"Written by `python benchmarks/planner_results.py schedules --microbatches 16 --out "
                            f"{out}`."), head
    assert "## bloom+a40_bf16, P = 8, M = 16" in out.read_text() and "\n| 1F1B | " in out.read_text()
    assert f"results written to {out}" in capsys.readouterr().out


def test_a_schedule_slower_than_1f1b_at_all_max_plans_at_its_fastest_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-3's GPipe at M = 16: its fastest time is an ulp above 1F1B all-max's, the budget at no slowdown, which
    the planner refuses (InfeasibleBudget); the row plans at its own fastest time and says so."""
    gpt3 = "gpt3-175b+a100_sxm_bf16"
    monkeypatch.setattr(schedules, "PROFILES", {gpt3: 83.64})
    monkeypatch.setattr(schedules, "ROWS", [("GPipe", "gpipe", None)])
    out = tmp_path / "schedules.md"
    assert planner_results.main(["schedules", "--microbatches", "16", "--out", str(out)]) == 0
    text = out.read_text()
    assert f"## {gpt3}, P = 8, M = 16" in text and "\n| GPipe | 3.448 | " in text
    assert "GPipe: planned at its fastest time, 3.44807831256 s, 8.9e-16 s above the budget at no slowdown" in text

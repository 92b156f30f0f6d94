"""Benchmarks write a new dated results file unless asked to update the committed one (issue #17)."""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
from pathlib import Path

import pytest

from benchmarks.common import RESULTS, ROOT, add_output_options, dated_path, output_path, write_results


def parse(argv: list[str], *, positional: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)  # a benchmark's own option keeps working beside them
    add_output_options(parser, "planner.md", positional=positional)
    return parser.parse_args(argv)


def test_default_is_a_new_dated_file_beside_the_committed_one() -> None:
    args = parse(["--repeat", "5"])
    path = output_path(args)
    assert args.repeat == 5
    assert path.parent == RESULTS and path.name.startswith("planner_") and path.suffix == ".md"
    assert path != RESULTS / "planner.md"


def test_dated_name() -> None:
    when = dt.datetime(2026, 11, 24, 10, 30, 15, tzinfo=dt.UTC)
    assert dated_path("clockd_faults.md", when) == RESULTS / "clockd_faults_2026-11-24T103015Z.md"


@pytest.mark.parametrize("positional", [False, True])
def test_update_and_out(positional: bool) -> None:
    assert output_path(parse(["--update"], positional=positional)) == RESULTS / "planner.md"
    out = ["x.md"] if positional else ["--out", "x.md"]
    assert output_path(parse(out, positional=positional)) == Path("x.md")


def test_update_and_out_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--update", "--out", "x.md"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_write_results_says_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "new" / "planner.md"
    path = write_results(parse(["--out", str(target)]), "# table")
    assert path == target and target.read_text() == "# table\n"
    line = capsys.readouterr().out.strip()
    assert line == f"results written to {target}; benchmarks/results/planner.md unchanged (--update overwrites it)"


def test_dated_files_are_ignored_by_git() -> None:
    def ignored(path: Path) -> bool:
        return subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(path)], check=False).returncode == 0

    probe = dated_path("planner.md").relative_to(ROOT)
    assert ignored(probe), f"{probe} is not in .gitignore"
    assert not ignored(Path("benchmarks/results/planner.md")), "the committed results file is ignored"

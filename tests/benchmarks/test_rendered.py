"""Every results file is rendered from committed raw files byte for byte, or named as written by its benchmark;
the index lists them all; one error convention; renderers refuse bad input with one line (issue #23)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import rendered
from benchmarks.common import RESULTS, ROOT, prediction_error
from benchmarks.runtime_study.rounds import order_that_ran, render_nov22
from benchmarks.search_study import twogpu
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime.summary import RunSummary

DATED = re.compile(r"_\d{4}-\d\d-\d\dT\d{6}Z\.")  # a new run's file name in examples (benchmarks.common.dated_path)
LLAMA = RESULTS / "h200_runs" / "runtime_llama_0454" / "llama" / "bench.json"


def committed_results() -> set[str]:
    """The results files here that git does not ignore (dated runs beside them are ignored, never committed)."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard",
                          "benchmarks/results/*.md"], capture_output=True, text=True, check=True).stdout
    return {Path(p).name for p in out.split() if (ROOT / p).is_file()} - {"README.md"}


@pytest.mark.parametrize("result", rendered.RENDERED, ids=lambda r: r.name)
def test_renderer_reproduces_the_committed_file(result: rendered.Rendered) -> None:
    committed = (RESULTS / result.name).read_text()
    assert result.render() == committed, f"{result.name} differs from its raw files: {result.command()}"
    assert f"`{result.command()}`" in committed, "the file names the command that renders it"


def test_every_results_file_is_rendered_or_written_and_indexed() -> None:
    names = {r.name for r in rendered.RENDERED}
    assert not names & set(rendered.WRITTEN), "a file cannot be both rendered and written"
    assert committed_results() == names | set(rendered.WRITTEN)
    index = (RESULTS / "README.md").read_text()
    for name in committed_results():
        assert f"[{name}]({name})" in index, f"{name} is not in benchmarks/results/README.md"


def test_every_raw_run_is_rendered_somewhere() -> None:
    used = {p.name for r in rendered.RENDERED for p in r.raw}
    runs = {p.name for root in ("h200_runs", "h100_runs") for p in (RESULTS / root).iterdir()
            if not p.name.endswith(".command.txt")}
    assert runs <= used, f"raw runs no results file renders: {sorted(runs - used)}"


def test_error_convention() -> None:
    assert prediction_error(predicted=0.9, measured=1.0) == pytest.approx(-0.1)
    assert prediction_error(predicted=1.1, measured=1.0) == pytest.approx(0.1)


def test_the_order_that_ran_comes_from_the_measured_units() -> None:
    run = json.loads(LLAMA.read_text())["runs"][0]["runtime_envpipe"]
    summary = RunSummary.from_json(run)
    assert summary.plan is not None and summary.plan.order.startswith("envpipe")
    assert order_that_ran(summary) == "1F1B, default clocks (plan not deployed)"  # what the GPU run really did
    deployed = copy.deepcopy(run)
    deployed["plan"]["deployed"] = True
    deployed["units_last_iteration"] = [
        [{"kind": u[0], "mb": int(u[1:]), "start_s": 0.0, "end_s": 0.0, "mhz": None} for u in stage]
        for stage in run["plan"]["orders"]]
    assert order_that_ran(RunSummary.from_json(deployed)) == "the plan's order, its planned clocks"
    one_f = [[{"kind": k, "mb": m, "start_s": 0.0, "end_s": 0.0, "mhz": None} for k, m in stage]
             for stage in one_f_one_b(2, 8)]
    deployed["units_last_iteration"] = one_f
    deployed["baseline"] = deployed["steady"]  # the plan's iterations were interleaved with 1F1B comparisons
    assert order_that_ran(RunSummary.from_json(deployed)).startswith("not seen (the last iteration was a 1F1B")
    deployed["units_last_iteration"] = []
    assert order_that_ran(RunSummary.from_json(deployed)) == "not recorded"


def test_a_changed_raw_file_shows(tmp_path: Path) -> None:
    raw = tmp_path / "runtime_llama_0454"
    (raw / "llama").mkdir(parents=True)
    for name in ("machine.txt", "command.txt"):
        (raw / name).write_text((LLAMA.parents[1] / name).read_text())
    bench = json.loads(LLAMA.read_text())
    bench["runs"][0]["runtime_envpipe"]["predicted_iteration_time_s"] *= 1.1
    (raw / "llama" / "bench.json").write_text(json.dumps(bench))
    (llama,) = [r for r in rendered.RENDERED if r.name == "runtime_h200_2026-11-23.md"]
    text = llama.renderer([raw])
    committed = (RESULTS / "runtime_h200_2026-11-23.md").read_text()
    assert text != committed and "**+6.5%**" in text and "**-3.2%**" in committed


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_renderers_refuse_bad_input_in_one_line(tmp_path: Path) -> None:
    not_archive = tmp_path / "x.tar.gz"
    not_archive.write_text("not an archive")
    nov22 = tmp_path / "rounds"  # a raw folder of 2026-11-22 without its machine.txt
    nov22.mkdir()
    (nov22 / "bench.json").write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["benchmarks/search_results.py", "two-gpu", str(not_archive)], "neither a directory nor a tar archive"),
        (["benchmarks/search_results.py", "two-gpu", str(tmp_path / "missing")], "No such file"),
        (["benchmarks/search_results.py", "two-gpu"], "give at least one OUT"),
        (["benchmarks/search_results.py", "call3", str(empty)], "call3: takes no arguments"),
        (["benchmarks/search_results.py", "call9"], "invalid choice: 'call9'"),
        (["benchmarks/runtime_results.py", "rounds", str(nov22)], "no machine.txt"),
        (["benchmarks/runtime_results.py", "rounds", str(empty)], "no */bench.json"),
        (["benchmarks/runtime_results.py", "dp-table", str(empty)], "give OUT and at least one RUN"),
        (["-m", "benchmarks.rendered", "nope.md"], "not a rendered results file: nope.md"),
    ]
    for args, message in cases:
        proc = run_script(*args)
        assert proc.returncode != 0 and proc.stdout == ""
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def test_the_check_passes_on_the_committed_files() -> None:
    assert rendered.main([]) == 0


def test_renderers_print_what_they_render(tmp_path: Path) -> None:
    """The scripts' command lines (as the index gives them) print the same text as the registry renders."""
    for result in rendered.RENDERED:
        script, *args = result.command().split()[1:]
        proc = run_script(script, *args)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == (RESULTS / result.name).read_text()


def test_legacy_and_search_renderers_take_the_raw_paths_they_are_given() -> None:
    # one folder alone renders only its own section
    text = render_nov22([RESULTS / "h200_runs" / "pp4_m8"])
    assert "| 4 | 8 | envpipe_order |" in text and "Interleaved rounds" not in text
    one = twogpu.render([RESULTS / "h200_runs" / "search_llama_0550.tar.gz"])
    assert "Over 8 runs:" in one and "gpt2" not in one


def test_docs_link_only_to_results_files_that_exist() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), RESULTS / "README.md"]
    missing = [f"{doc.relative_to(ROOT)}: {name}" for doc in docs
               for name in re.findall(r"benchmarks/results/([\w./-]+\.(?:md|json|tar\.gz))", doc.read_text())
               if not (RESULTS / name).exists() and not DATED.search(name)]
    assert not missing, missing


def test_the_demos_gantt_picture_is_drawn_from_its_raw_files(tmp_path: Path) -> None:
    """README's picture: the runtime's own Gantt of the committed demo run, pixel for pixel (the PNG's metadata,
    which names matplotlib's version, aside)."""
    from PIL import Image, ImageChops

    from benchmarks import demo_results

    again = demo_results.draw(demo_results.RAW, tmp_path / "g.png")
    with Image.open(demo_results.GANTT) as committed, Image.open(again) as drawn:
        assert committed.size == drawn.size
        assert ImageChops.difference(committed.convert("RGB"), drawn.convert("RGB")).getbbox() is None

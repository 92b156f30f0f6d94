"""`envpipe plan` / `envpipe simulate` end to end on both real profiles (in-process, via click)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from envpipe.atomicfile import new_file_mode
from envpipe.cli import main
from envpipe.plan.case import PipelineCase
from envpipe.plan.planfile import Plan
from envpipe.profile import embedded_profile_path, load_profile
from tests.support.perseus import IDLE_W


@pytest.mark.parametrize("name", list(IDLE_W))
@pytest.mark.parametrize(("schedule", "policy", "reconfig"),
                         [("1f1b", "baseline", "default"), ("1f1b", "uniform", "default"),
                          ("envpipe", "envelope", "greedy"), ("envpipe", "envelope", "balanced"),
                          ("gpipe", "envelope", "default")])
def test_plan_then_simulate_agree(tmp_path, name, schedule, policy, reconfig):
    profile = str(embedded_profile_path(name))
    out, png = tmp_path / "plan.json", tmp_path / "g.png"
    runner = CliRunner()
    res = runner.invoke(main, ["plan", "--profile", profile, "-m", "12", "--schedule", schedule, "--policy", policy,
                               "--reconfig", reconfig, "--idle-power", str(IDLE_W[name]), "--out", str(out),
                               "--text", "--gantt", str(png)])
    assert res.exit_code == 0, res.output
    assert "Stage 7 | " in res.output and "energy saving" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    predicted = json.loads(out.read_text())["predicted"]
    sim = runner.invoke(main, ["simulate", "--profile", profile, "--plan", str(out), "--idle-power", str(IDLE_W[name])])
    assert sim.exit_code == 0, sim.output
    assert f"{predicted['iteration_time_s']:.4f} s" in sim.output
    assert f"{predicted['energy_j']:.1f} J" in sim.output
    assert "claims" not in sim.output


def test_text_trace_format_and_svg(tmp_path):
    svg = tmp_path / "g.svg"
    res = CliRunner().invoke(main, ["plan", "--profile", str(embedded_profile_path()), "-m", "4", "--stages", "4",
                                    "--gpu", "a100", "--text", "--gantt", str(svg)])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Stage ")]
    assert len(lines) == 4 and lines[0].startswith("Stage 0 | [F0 1410 0.0]")
    assert "blocking power 83.64 W" in res.output  # the A100's measured blocking power by default
    assert res.output.index("legend: each unit is") < res.output.index("Stage 0 | ")  # the trace says how to read it
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "missing.csv", "-m", "4", "--idle-power", "80"], "cannot open"),
        (["-m", "4", "--idle-power", "80"], "Missing option '--profile'"),
        (["--profile", "{p}", "-m", "0", "--idle-power", "80"], "0 is not in the range"),
        (["--profile", "{p}", "-m", "4"], "give --blocking-power"),
        (["--profile", "{p}", "-m", "4", "--idle-power", "-3"], "must be in [0, 10000], got -3"),
        (["--profile", "{p}", "-m", "4", "--idle-power", "80,90"], "2 blocking powers given for 8 stages"),
        (["--profile", "{p}", "-m", "4", "--idle-power", "80", "--tail-power", "x"], "expected watts"),
        (["--profile", "{p}", "-m", "4", "--idle-power", "80", "--policy", "turbo"], "Invalid value for '--policy'"),
        (["--profile", "{p}", "-m", "4", "--idle-power", "80", "--gantt", "g.pdf"], "must end in .png or .svg"),
        (["--profile", "{bad}", "-m", "4", "--idle-power", "80"], "bad.csv:2: time must be in (0, 3600], got 0"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(tmp_path, args, message):
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,0,1\n")
    out = tmp_path / "plan.json"
    argv = ["plan", *[a.format(p=embedded_profile_path(), bad=bad) for a in args], "--out", str(out)]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code != 0
    assert message in res.output
    assert not out.exists()


def test_simulate_reports_inconsistent_plans(tmp_path):
    plan = tmp_path / "p.json"
    runner = CliRunner()
    profile = str(embedded_profile_path())
    made = runner.invoke(main, ["plan", "--profile", profile, "-m", "8", "--gpu", "a100", "--policy", "envelope",
                                "--out", str(plan)])
    assert made.exit_code == 0
    data = json.loads(plan.read_text())
    data["stages"][3][5]["freq_mhz"] = 777
    plan.write_text(json.dumps(data))
    res = runner.invoke(main, ["simulate", "--profile", profile, "--plan", str(plan), "--gpu", "a100"])
    assert res.exit_code == 1 and "777 MHz is not a clock of the profile" in res.output
    data["stages"][3][5]["freq_mhz"] = 1410
    data["predicted"]["iteration_time_s"] = 1.0
    plan.write_text(json.dumps(data))
    res = runner.invoke(main, ["simulate", "--profile", profile, "--plan", str(plan), "--gpu", "a100"])
    assert res.exit_code == 0 and "the plan claims 1.0000 s" in res.output



def baseline_plan_and_simulate(tmp_path):
    """Plan 1F1B all-max (M=4) on the embedded profile; return its claimed time and a `simulate` runner."""
    profile, out, runner = str(embedded_profile_path()), tmp_path / "plan.json", CliRunner()
    res = runner.invoke(main, ["plan", "--profile", profile, "-m", "4", "--schedule", "1f1b", "--policy", "baseline",
                               "--reconfig", "default", "--gpu", "a100", "--out", str(out)])
    assert res.exit_code == 0, res.output
    claimed = json.loads(out.read_text())["predicted"]["iteration_time_s"]
    return claimed, lambda *args: runner.invoke(
        main, ["simulate", "--profile", profile, "--plan", str(out), "--gpu", "a100", *args])


def test_simulate_with_tail_times(tmp_path):
    claimed, simulate = baseline_plan_and_simulate(tmp_path)
    res = simulate("--tail-time", "0.5")
    assert res.exit_code == 0, res.output
    assert f"{claimed + 0.5:.4f} s" in res.output
    res = simulate("--tail-time", ",".join(["0"] * 7 + ["0.5"]))  # the last stage ends early: slack absorbs it
    assert res.exit_code == 0 and f"{claimed:.4f} s" in res.output


@pytest.mark.parametrize(("value", "message"), [("x", "expected seconds"),
                                                ("-1", "tail times must be in [0, 3600], got -1"),
                                                ("0.1,0.2", "2 tail times given for 8 stages")])
def test_simulate_refuses_bad_tail_times(tmp_path, value, message):
    res = baseline_plan_and_simulate(tmp_path)[1]("--tail-time", value)
    assert res.exit_code != 0 and message in res.output


def test_plan_with_tail_time(tmp_path):
    profile = str(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))
    base = ["plan", "--profile", profile, "-m", "8", "--policy", "baseline", "--gpu", "a100"]
    plain = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "a.json")])
    tailed = CliRunner().invoke(main, [*base, "--tail-time", "0.5", "--out", str(tmp_path / "b.json")])
    assert plain.exit_code == 0 and tailed.exit_code == 0, tailed.output
    t0 = json.loads((tmp_path / "a.json").read_text())["predicted"]["iteration_time_s"]
    t1 = json.loads((tmp_path / "b.json").read_text())["predicted"]["iteration_time_s"]
    assert t1 == pytest.approx(t0 + 0.5)


@pytest.mark.slow  # the planner's tail against the MILP: tests/plan/test_optimal_oracle.py (fast)
def test_optimal_plan_with_tail_time(tmp_path):
    """The optimal planner takes the tail too: the budget (1F1B at the highest clock) and the plan's iteration
    both end 0.5 s later; per-stage tails are accepted."""
    pytest.importorskip("scipy", reason="the optimal planner needs scipy")
    profile = str(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))
    base = ["plan", "--profile", profile, "-m", "4", "--policy", "optimal", "--idle-power", "83.64"]
    plain = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "a.json")])
    tailed = CliRunner().invoke(main, [*base, "--tail-time", "0.5", "--out", str(tmp_path / "b.json")])
    assert plain.exit_code == 0 and tailed.exit_code == 0, tailed.output
    budget = [float(x.split("time budget ")[1].split(" s")[0]) for x in (plain.output, tailed.output)]
    assert budget[1] == pytest.approx(budget[0] + 0.5, abs=1e-4)
    t0, t1 = (json.loads((tmp_path / f).read_text())["predicted"]["iteration_time_s"] for f in ("a.json", "b.json"))
    assert t1 == pytest.approx(t0 + 0.5, rel=1e-3) and t1 <= budget[1] + 1e-9
    per_stage = CliRunner().invoke(main, [*base, "--tail-time", ",".join(["0"] * 7 + ["0.5"])])
    assert per_stage.exit_code == 0, per_stage.output
    res = CliRunner().invoke(main, [*base, "--tail-time", "0.1,0.2"])
    assert res.exit_code != 0 and "2 tail times given for 8 stages" in res.output


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(res) -> str:
    """The contract for bad input: status != 0, one line on stderr, no traceback."""
    assert res.exit_code not in (0, None) and isinstance(res.exception, SystemExit | None), res.exception
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    return lines[0]


GPT3 = str(embedded_profile_path())
GPT3_TEXT = embedded_profile_path().read_bytes().decode()  # CRLF, as shipped
PLAN_ARGS = ("plan", "--profile", GPT3, "-m", "4", "--gpu", "a100", "--policy", "envelope")  # quick to plan


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--idle-power", "nan"], "'--blocking-power' / '--idle-power': blocking powers must be a finite number, "
                                  "got nan"),
        (["--idle-power", "inf"], "blocking powers must be a finite number, got inf"),
        (["--tail-power", "1e308"], "Invalid value for '--tail-power': tail powers must be in [0, 10000]"),
        (["--transfer-time", "1e308"], "Invalid value for '--transfer-time': must be in [0, 3600], got 1e+308"),
        (["--tail-time", "nan"], "tail times must be a finite number, got nan"),
        (["--threshold-scale", "inf"], "must be a finite number, got inf"),
        (["--policy", "optimal", "--time-budget", "1e308"], "'--time-budget': must be in (0, 1e+09]"),
        (["--policy", "optimal", "--max-slowdown", "nan"], "'--max-slowdown': the slowdown must be a finite number"),
        # a bare 5 was +500 % here and [0, 1) in the runtime: one convention, the other reading spelled out
        (["--policy", "optimal", "--max-slowdown", "5"], "'--max-slowdown': the slowdown 5 is not a fraction in "
                                                          "[0, 1): for +5 % write 5% or 0.05"),
        (["-m", "200000"], "200000 is not in the range 1<=x<=65536"),  # 90 s and 1.3 GB before
        (["--stages", "1025"], "1025 is not in the range 1<=x<=1024"),
        (["--stages", "1000", "-m", "1000"], "1000 stages x 1000 micro-batches is 2,000,000 units; the planner "
                                             "takes at most 131,072"),
        (["--schedule", "zigzag"], "'zigzag' is not one of '1f1b', 'envpipe', 'gpipe', 'interleaved', 'dualpipev'. "
                                   "(see 'main plan -h')"),
    ],
)
def test_options_out_of_range_are_one_line_errors(tmp_path, args, message):
    """`--idle-power nan` and `--transfer-time 1e308` printed nan/inf results; usage errors were 4 lines."""
    res = invoke(*PLAN_ARGS, *args, "--out", tmp_path / "p.json")
    assert message in one_line_error(res)
    assert list(tmp_path.iterdir()) == []


def test_bad_profiles_are_one_line_errors(tmp_path):
    zero = tmp_path / "zero.csv"  # one stage with zero energy: ZeroDivisionError before
    zero.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,0.1,0\n0,backward,1410,0.2,0\n")
    assert "zero.csv:2: energy must be in (0, 1e+07], got 0" in one_line_error(
        invoke("plan", "--profile", zero, "-m", "4", "--idle-power", "0"))
    if Path("/dev/zero").exists():  # read whole before: memory until killed; now refused before a byte is read
        assert "/dev/zero: not a regular file" in one_line_error(
            invoke("plan", "--profile", "/dev/zero", "-m", "4", "--idle-power", "80"))
    dup = tmp_path / "dup.csv"  # a duplicated column was read silently
    header, *rows = GPT3_TEXT.splitlines()
    dup.write_text("\n".join([f"{header},time", *(f"{r},0.1" for r in rows)]) + "\n")
    assert "dup.csv:1: duplicate column(s): 'time'" in one_line_error(
        invoke("plan", "--profile", dup, "-m", "4", "--idle-power", "80"))




def test_bom_profile_plans_like_the_plain_one(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + GPT3_TEXT.encode())
    plain, with_bom = invoke(*PLAN_ARGS), invoke(*PLAN_ARGS[:2], bom, *PLAN_ARGS[3:])
    assert plain.exit_code == 0 and with_bom.exit_code == 0, with_bom.output
    assert plain.stdout == with_bom.stdout


def test_out_into_a_missing_directory_is_created_and_readable(tmp_path):
    """`--out` into a missing directory was a traceback after planning; plan files were mode 0600."""
    out = tmp_path / "new" / "deeper" / "plan.json"
    res = invoke(*PLAN_ARGS, "--out", out)
    assert res.exit_code == 0, res.output
    assert out.stat().st_mode & 0o777 == new_file_mode()  # 0644 under umask 022
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.json"]


@pytest.mark.parametrize(("where", "message"), [("{file}/plan.json", "is not a directory"),
                                                ("{dir}", "is a directory")])
def test_unwritable_out_is_refused_before_planning(tmp_path, where, message):
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = invoke(*PLAN_ARGS, "--policy", "optimal", "--out", where.format(file=blocker, dir=tmp_path))
    assert message in one_line_error(res) and "Invalid value for '--out'" in res.stderr
    assert res.stdout == ""  # refused before planning: nothing planned, nothing printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_simulate_refuses_a_plan_made_from_another_profile(tmp_path):
    """Plans record the digest of their profile; simulating one on another profile was silent."""
    out = tmp_path / "plan.json"
    assert invoke(*PLAN_ARGS, "--out", out).exit_code == 0
    assert json.loads(out.read_text())["profile_digest"].startswith("sha256:")
    lf = tmp_path / "same_numbers.csv"  # another file of the same numbers is the same profile
    lf.write_text(GPT3_TEXT.replace("\r\n", "\n"))
    assert invoke("simulate", "--profile", lf, "--plan", out, "--gpu", "a100").exit_code == 0
    other = tmp_path / "other.csv"
    other.write_text(GPT3_TEXT.replace("23.80547200000007", "23.9", 1))
    line = one_line_error(invoke("simulate", "--profile", other, "--plan", out, "--gpu", "a100"))
    assert f"{out}: made from another profile than {other}" in line


def test_every_option_has_help_and_choices_are_listed():
    from envpipe.cli import plan, simulate

    for command in (plan, simulate):
        for param in command.params:
            assert isinstance(param, click.Option) and param.help, (command.name, param.name)
    text = invoke("plan", "-h").stdout
    for choices in ("[1f1b|envpipe|gpipe|interleaved|dualpipev]", "[baseline|uniform|envelope|optimal]",
                    "[default|greedy|balanced]"):
        assert choices in text
    version = invoke("--version")
    assert version.exit_code == 0 and "version" in version.stdout


@pytest.mark.parametrize("policy", ["baseline", "optimal"])
def test_stages_note_comes_only_with_a_result(tmp_path, policy):
    """The what-if note on stderr must not precede an error (an error is the only stderr line)."""
    ok = invoke(*PLAN_ARGS, "--policy", policy, "--stages", "3")
    assert ok.exit_code == 0 and ok.stderr.startswith("note: --stages 3")
    bad = invoke(*PLAN_ARGS, "--policy", policy, "--stages", "3", "--tail-time", "0.1,0.2")
    assert "3 stages" in one_line_error(bad)


def test_frontier_rows_tell_points_apart_and_progress_is_counted(tmp_path):
    """The last frontier rows printed identical numbers (the same plan kept for a longer budget)."""
    pytest.importorskip("scipy")
    from envpipe.plan.optimal.frontier import frontier

    calls = []
    profile = load_profile(embedded_profile_path()).with_stages(3)
    frontier(PipelineCase.of(profile, 4, 83.64), points=3, on_point=lambda: calls.append(1))
    assert len(calls) == 3  # what drives the progress bar
    front = tmp_path / "f" / "front.csv"
    res = invoke("plan", "--profile", GPT3, "--stages", "3", "-m", "4", "--gpu", "a100", "--policy", "optimal",
                 "--frontier", front, "--frontier-points", "6")
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.stdout.splitlines() if re.match(r"\s+\d", ln)]
    points = list(csv.DictReader(front.open()))
    assert len(rows) == 6 and len(set(rows)) == 6
    for row, point in zip(rows, points, strict=True):
        budget, time_s, energy = (float(x) for x in row.split()[:3])
        assert (budget, time_s) == pytest.approx((float(point["budget_s"]), float(point["time_s"])), abs=1e-4)
        assert energy == pytest.approx(float(point["energy_j"]), abs=0.01)
    for i in range(1, 6):
        same = all(points[i][k] == points[i - 1][k] for k in ("time_s", "energy_j"))
        assert rows[i].endswith("same plan as above") == same
        assert Plan.load(points[i]["plan"]).profile_digest == profile.digest


def test_cli_start_up_imports_no_solver() -> None:
    """`envpipe --help` and every subcommand's option parsing load no scipy (the optimal planner's LP,
    which the search uses too): it is imported when a command plans, so the CLI starts in a fraction of a
    second (benchmarks/results/planner_scale.md times it)."""
    code = ("import sys; import envpipe.cli; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'torch', 'matplotlib')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


BLOOM = str(embedded_profile_path("bloom+a40_bf16"))


def test_default_policy_is_optimal_and_a_slower_envpipe_plan_is_warned_about():
    """README's first example: the optimal planner by default; EnvPipe's envelope on BLOOM runs 15 % slower
    than the baseline (docs/planner.md), which used to print with no warning."""
    base = ("plan", "--profile", BLOOM, "-m", "24", "--blocking-power", "70.38")
    default = invoke(*base)
    assert default.exit_code == 0, default.output
    assert ", policy optimal: 8 stages x 24 micro-batches" in default.stdout and "warning" not in default.stderr
    slowdown = float(re.search(r"slowdown\s+(-?[\d.]+) %", default.stdout).group(1))
    assert slowdown <= 0.0  # within its budget, the baseline's time
    envelope = invoke(*base, "--policy", "envelope", "--reconfig", "balanced")
    assert envelope.exit_code == 0, envelope.output
    warning = re.fullmatch(r"warning: this plan is ([\d.]+) % slower than the 1F1B all-max baseline: EnvPipe's "
                           r"envelope policy does not keep to a time budget \(--policy optimal does\)\n",
                           envelope.stderr)
    assert warning and float(warning.group(1)) == pytest.approx(15.49, abs=0.01)
    assert f"slowdown                      {warning.group(1)} %" in envelope.stdout


@pytest.mark.parametrize(("schedule", "order"), [("interleaved", "interleaved 1F1B, 2 chunks per stage"),
                                                 ("dualpipev", "DualPipeV, 2 chunks per stage")])
def test_chunked_plans_name_their_schedule_and_baseline(schedule, order):
    """These plans said "(plain 1F1B)" and compared with "1F1B all-max" while the budget is their own all-max."""
    pytest.importorskip("scipy")
    res = invoke(*PLAN_ARGS, "--stages", "2", "-m", "4", "--schedule", schedule, "--policy", "optimal")
    assert res.exit_code == 0, res.output
    name = {"interleaved": "interleaved 1F1B", "dualpipev": "DualPipeV"}[schedule]
    assert res.stdout.startswith(f"{name}, policy optimal: 2 stages x 4 micro-batches")
    assert f"(the {name} all-max time: no slowdown)" in res.stdout
    assert f"chosen order: {order}\n" in res.stdout and "1F1B all-max" not in res.stdout.replace(f"{name} all-max", "")
    assert f"baseline ({name} all-max) time" in res.stdout
    assert "that schedule's own" in " ".join(invoke("plan", "-h").stdout.split())  # --max-slowdown's help


def test_tail_power_and_per_stage_blocking_power_reach_the_simulation(tmp_path):
    """A tail charged at its own power adds (tail power - blocking power) x tail to every stage's energy; the
    blocking power may differ per stage."""
    _, simulate = baseline_plan_and_simulate(tmp_path)

    def energy(*args: str) -> float:
        res = simulate(*args)
        assert res.exit_code == 0, res.output
        return float(re.search(r"\n  energy\s+([\d.]+) J", res.stdout).group(1))

    at_blocking = energy("--tail-time", "0.5")
    at_300 = energy("--tail-time", "0.5", "--tail-power", "300")
    assert at_300 - at_blocking == pytest.approx(8 * 0.5 * (300 - 83.64), abs=0.1)
    one = energy("--blocking-power", "83.64")
    per_stage = energy("--blocking-power", ",".join(["83.64"] * 7 + ["183.64"]))
    assert per_stage > one and energy("--blocking-power", ",".join(["83.64"] * 8)) == one
    res = simulate("--tail-power", "1,2")
    assert res.exit_code != 0 and "2 tail powers given for 8 stages" in res.output


@pytest.mark.slow  # a new interpreter that plans with HiGHS (about 2 s)
def test_the_solvers_own_output_stays_off_stdout(tmp_path):
    """HiGHS prints `HighsMipSolverData::...` from C++ during the MILP polish (this small case made it print 3
    times where nothing held it back): only the plan reaches stdout."""
    profile = str(embedded_profile_path("bloom+a100_sxm_bf16"))
    envpipe = str(Path(sys.executable).with_name("envpipe"))
    done = subprocess.run([envpipe, "plan", "--profile", profile, "-m", "2", "--gpu", "a100", "--max-slowdown", "0.08"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Highs" not in done.stdout and "energy saving" in done.stdout

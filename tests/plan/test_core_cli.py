"""`envpipe plan` / `envpipe simulate` end to end on both real profiles (in-process, via click)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from envpipe.cli import main
from envpipe.profile import embedded_profile_path
from tests.conftest import IDLE_W


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
    assert "idle power 83.64 W" in res.output  # the A100's measured blocking power by default
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "missing.csv", "-m", "4", "--idle-power", "80"], "cannot open"),
        (["-m", "4", "--idle-power", "80"], "Missing option '--profile'"),
        (["--profile", "{p}", "-m", "0", "--idle-power", "80"], "0 is not in the range"),
        (["--profile", "{p}", "-m", "4"], "give --idle-power"),
        (["--profile", "{p}", "-m", "4", "--idle-power", "-3"], "must be in [0, 10000], got -3"),
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
    made = runner.invoke(main, ["plan", "--profile", profile, "-m", "8", "--gpu", "a100", "--out", str(plan)])
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


@pytest.mark.parametrize(("value", "message"), [("x", "expected seconds"), ("-1", "tail times must be in [0, 3600], got -1"),
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

"""The optimal planner gives the same plan at any load (no clock is read inside it; the user's --time-limit is the
only clock, off by default, and the plan says when it cut the search), and more budget never a dearer plan."""

from __future__ import annotations

import hashlib
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from envpipe.cli import main
from envpipe.plan import instances
from envpipe.plan.case import PipelineCase
from envpipe.plan.instances import BLOCKING_POWER_W, real_profile, spread_clocks
from envpipe.plan.optimal.frontier import frontier
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.plan.optimal.problem import build_problem
from envpipe.plan.optimal.solve import solve
from envpipe.plan.optimal.timelimit import TimeLimit
from envpipe.plan.planfile import Plan
from envpipe.profile import embedded_profile_path, load_profile

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path("/work/shared/data/profiles")
CLOCKS = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time")


def digest(plan: Plan) -> str:
    """Every byte of the plan file: orders, clocks and the predicted numbers, to the last bit."""
    return hashlib.sha256(json.dumps(plan.to_json(), sort_keys=True).encode()).hexdigest()


def cut(name: str, stages: int, clocks: int, microbatches: int) -> PipelineCase:
    prof = real_profile(name)
    return PipelineCase.of(instances.cut_down(prof, list(range(stages)), spread_clocks(prof, clocks)), microbatches,
                           BLOCKING_POWER_W[name])


def test_no_clock_is_read_inside_the_optimiser(monkeypatch: pytest.MonkeyPatch, gpt3) -> None:
    """Every clock of the time module raises while the planner runs: the MILP polish (4 x 8 x 8), the folded LP
    and the budget ladder's lower rungs with their bounds (8 x 48, a slowdown off the ladder's steps) and a
    frontier (8 x 24). Before, the polish read time.monotonic for its deadline."""
    cases = [(cut("gpt3-175b+a100_sxm_bf16", 4, 8, 8), "1f1b", None),
             (PipelineCase.of(gpt3, 48, 83.64), "1f1b", 0.0123)]
    problem = build_problem(cases[0][0], "1f1b", [0] * 4)

    def stopped(*_: object) -> float:
        raise AssertionError("the optimiser read a clock")

    for name in CLOCKS:
        monkeypatch.setattr(time, name, stopped)
    try:
        plans = [optimal_plan(case, schedule, max_slowdown=slowdown) for case, schedule, slowdown in cases]
        points = frontier(PipelineCase.of(gpt3, 24, 83.64), "envpipe", points=3)
        sol = solve(problem, problem.fastest_time() * 1.02)
    finally:
        monkeypatch.undo()
    assert all(p.notes == () or p.notes[0].startswith("LP lower bound") for p in plans)
    assert len(points) == 3 and sol.timeline.iteration_time <= problem.fastest_time() * 1.02


def test_a_time_limit_cuts_the_search_short_and_says_what_it_left_out() -> None:
    """A fake clock past the limit once the LP is solved: the search keeps its first rounding, skips the rest and
    the polish, and the plan still fits the budget; without a limit the clock is never read."""
    problem = build_problem(cut("bloom+a40_bf16", 4, 8, 8), "1f1b", [0] * 4)
    budget = problem.fastest_time() * 1.03
    readings = itertools.chain([0.0, 0.0], itertools.repeat(5.0))  # made, the LP's own limit, then up
    limit = TimeLimit(1.0, clock=lambda: next(readings))
    cut_short = solve(problem, budget, limit)
    assert cut_short.timeline.iteration_time <= budget
    assert limit.skipped == ["other roundings of the LP", "MILP polish rounds"]
    assert limit.note()[0].startswith("search cut short by the time limit (1 s): left out other roundings")
    assert solve(problem, budget, TimeLimit(clock=lambda: 1 / 0)).timeline.energy <= cut_short.timeline.energy
    with pytest.raises(ValueError, match="must be positive"):
        TimeLimit(0.0)


def test_the_cli_says_when_its_time_limit_cut_the_search(tmp_path: Path) -> None:
    prof = tmp_path / "p.csv"
    instances.cut_down(real_profile("gpt3-175b+a100_sxm_bf16"), [0, 1, 2, 3], spread_clocks(real_profile(
        "gpt3-175b+a100_sxm_bf16"), 8)).to_csv(prof)
    runner = CliRunner()
    args = ["plan", "--profile", str(prof), "-m", "8", "--gpu", "a100", "--out", str(tmp_path / "plan.json")]
    limited = runner.invoke(main, [*args, "--time-limit", "1e-9"])
    assert limited.exit_code == 0, limited.output
    assert "search cut short by the time limit (1e-09 s)" in limited.output
    plan = Plan.load(tmp_path / "plan.json")
    assert plan.predicted["iteration_time_s"] <= plan.predicted["baseline_time_s"]
    free = runner.invoke(main, args)
    assert free.exit_code == 0 and "cut short" not in free.output
    for bad in ("0", "-1", "nan", "inf"):
        refused = runner.invoke(main, [*args, "--time-limit", bad])
        assert refused.exit_code == 2 and "--time-limit" in refused.output and "Traceback" not in refused.output
    envelope = runner.invoke(main, [*args, "--policy", "envelope", "--time-limit", "5"])
    assert envelope.exit_code == 2 and "need --policy optimal" in envelope.output


def test_the_issues_budgets_are_monotone_now(gpt3) -> None:
    """GPT-3/A100, M = 96, 1F1B: 18.4645 s gave 26.759 % where 18.3006 s gave 26.816 % with a plan that also fits
    the longer budget; now the longer budget's plan costs no more."""
    case = PipelineCase.of(gpt3, 96, 83.64)
    shorter, longer = (optimal_plan(case, "1f1b", budget) for budget in (18.3006, 18.4645))
    assert longer.timeline.iteration_time <= 18.4645
    assert longer.timeline.energy <= shorter.timeline.energy


# the four profiles shipped in envpipe/profile/data (the two in /work/shared/data/profiles are two of them), each
# with one schedule here; every profile with both, whole: the slow tier's test below
MONOTONE_CASES = list(zip(sorted(BLOCKING_POWER_W), ["1f1b", "envpipe"] * 2, strict=True))


@pytest.mark.parametrize(("name", "schedule"), MONOTONE_CASES)
@settings(max_examples=3, deadline=None)
@given(fractions=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=3), microbatches=st.sampled_from([3, 4]))
def test_more_budget_never_gives_a_dearer_plan(name: str, schedule: str, fractions: list[float],
                                               microbatches: int) -> None:
    """Budgets anywhere from the fastest iteration to 15 % over the baseline, on 3-stage cut-downs of the shipped
    profiles."""
    assert_monotone(cut(name, 3, 8, microbatches), schedule, fractions)


def assert_monotone(case: PipelineCase, schedule: str, fractions: list[float]) -> None:
    base = optimal_plan(case, schedule)
    fastest = min(build_problem(case, schedule, r).fastest_time() for r, _ in base.tried)
    budgets = sorted(fastest + f * (1.15 * base.baseline.iteration_time - fastest) for f in fractions)
    energies = [optimal_plan(case, schedule, b).timeline.energy for b in budgets]
    assert np.all(np.diff(energies) <= 0), list(zip(budgets, energies, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(SHARED.glob("*.csv")) or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"no shared profiles at {SHARED}"))])
@pytest.mark.parametrize("schedule", ["1f1b", "envpipe"])
@settings(max_examples=8, deadline=None)
@given(fractions=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4), microbatches=st.sampled_from([12, 24, 48]))
def test_more_budget_never_gives_a_dearer_plan_on_the_shared_profiles(path: Path, schedule: str,
                                                                      fractions: list[float],
                                                                      microbatches: int) -> None:
    name = path.stem
    case = PipelineCase.of(load_profile(path), microbatches, BLOCKING_POWER_W[name])
    assert_monotone(case, schedule, fractions)


SAME_PLANS = """
import hashlib, json, sys
from envpipe.plan.case import PipelineCase
from envpipe.plan.instances import BLOCKING_POWER_W
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.profile import embedded_profile_path, load_profile
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1][:-4]
    for m in (12, 24, 48, 96):
        for schedule in ("1f1b", "envpipe"):
            plan = optimal_plan(PipelineCase.of(load_profile(path), m, BLOCKING_POWER_W[name]), schedule).plan
            print(name, m, schedule, hashlib.sha256(json.dumps(plan.to_json(), sort_keys=True).encode()).hexdigest())
"""


@pytest.mark.slow
def test_the_16_perseus_cases_give_the_same_plans_beside_a_cpu_hog() -> None:
    """The shared profiles' 16 cases (2 profiles x M = 12, 24, 48, 96 x both schedules), planned twice in fresh
    processes, the second time beside two busy loops on this 2-core machine: the plan files are the same bytes."""
    paths = [str(p) for p in sorted(SHARED.glob("*.csv"))] or [
        str(embedded_profile_path(n)) for n in ("bloom+a40_bf16", "gpt3-175b+a100_sxm_bf16")]
    quiet = subprocess.run([sys.executable, "-c", SAME_PLANS, *paths], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = subprocess.run([sys.executable, "-c", SAME_PLANS, *paths], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert len(quiet.splitlines()) == 16 and quiet == busy


def test_an_lp_beyond_the_planners_limit_is_one_line_and_64_stages_take_any_micro_batches(tmp_path: Path) -> None:
    """The documented cap, 131,072 units, as 1,024 stages x 64 micro-batches: its LP (nothing repeats) is beyond
    MAX_LP_UNITS, refused in one line before any LP runs; 64 stages x 1,024 micro-batches fold to 15,360."""
    from envpipe.limits import MAX_LP_UNITS

    path = embedded_profile_path("gpt3-175b+a100_sxm_bf16")
    folded = build_problem(PipelineCase.of(load_profile(path).with_stages(64), 1024, 83.64), "1f1b", [0] * 64).fold
    assert folded.size <= MAX_LP_UNITS
    refused = CliRunner().invoke(main, ["plan", "--profile", str(path), "--stages", "1024", "-m", "64", "--gpu",
                                        "a100", "--out", str(tmp_path / "p.json")])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    (line,) = [x for x in refused.output.splitlines() if x.startswith("Error")]
    assert "1024 stages x 64 micro-batches: the optimal planner's LP would have 131,072 units" in line
    assert f"it takes at most {MAX_LP_UNITS:,}" in line and not (tmp_path / "p.json").exists()

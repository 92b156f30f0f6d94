"""Benchmark of the optimal planner: savings against Perseus and EnvPipe, MILP gap, speed and scaling.

Writes a new dated file beside benchmarks/results/optimal.md (`--update` overwrites that one). Every
energy/time number is *simulated on the measured profile* (the plan is saved as JSON, loaded back and
re-simulated with envpipe.plan.evaluate.evaluate_plan, which is what `envpipe simulate` runs); planner run times
are *measured* on this machine.

    python benchmarks/planner_results.py optimal [--quick] [--update | --out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import add_output_options, write_results
from envpipe.plan.case import PipelineCase, Planned
from envpipe.plan.evaluate import evaluate_plan
from envpipe.plan.instances import (
    BLOCKING_POWER_W,
    Case,
    cut_down,
    exact_energy,
    random_case,
    real_profile,
    spread_clocks,
)
from envpipe.plan.optimal.fold import identity_fold
from envpipe.plan.optimal.frontier import frontier
from envpipe.plan.optimal.lp import InfeasibleBudget, solve_relaxation
from envpipe.plan.optimal.milp import MilpUnsolved
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.plan.optimal.problem import build_problem
from envpipe.plan.planfile import Plan
from envpipe.plan.planner import make_plan
from envpipe.plan.policies import POLICIES
from envpipe.plan.reconfig import RECONFIGS, Reconfig
from envpipe.plan.simulate import Timeline

# the exact MILP's limits, in branch-and-bound nodes (a count: which cases it solves does not depend on the load)
EXACT_NODES = 1_000_000
RANDOM_NODES = 200_000
FRONTIERS = Path(os.environ.get("PERSEUS_FRONTIERS", "/work/shared/data/perseus_frontiers"))
PROFILES = ("gpt3-175b+a100_sxm_bf16", "bloom+a40_bf16")  # shipped with the package; idle power: BLOCKING_POWER_W
# Perseus's least energy with its own time <= the exact 1F1B all-max time, read from its published frontiers
# (ml-energy/zeus, branch kronos, sosp24_data/emulation/iteration_time_energy/, rows time,energy)
PERSEUS_OTHER = {("bloom+a100_sxm_bf16", 12): 6316.46615047702,  # a100_sxm/bloom_bf16_mb12.csv, row 2.823 s
                 ("bloom+a100_sxm_bf16", 96): 50198.350799349544,  # a100_sxm/bloom_bf16_mb96.csv, row 15.448 s
                 ("gpt3-175b+a40_bf16", 12): 11075.808898620024,  # a40/gpt3-175b_bf16_mb12.csv, row 7.5463 s
                 ("gpt3-175b+a40_bf16", 96): 81796.70704770296}  # a40/gpt3-175b_bf16_mb96.csv, row 41.2823 s


def resimulated(plan: Plan, case: PipelineCase) -> tuple[float, float]:
    """(time, energy) of a plan after a JSON round trip, as `envpipe simulate` computes them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        plan.save(path)
        tl = evaluate_plan(Plan.load(path), case)
    return tl.iteration_time, tl.energy


def perseus_savings(name: str, M: int, base_time: float, base_energy: float) -> tuple[str, str]:
    """Perseus's best saving with its own time <= the exact all-max time (README's reference), and the
    same after aligning its 1 ms-rounded time axis so that its fastest point is the exact all-max time."""
    path = FRONTIERS / f"{name}_mb{M}.csv"
    if not path.exists():
        return "n/a", "n/a"
    pts = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    raw = pts[pts[:, 0] <= base_time, 1].min()
    scale = base_time / pts[:, 0].min()
    aligned = pts[pts[:, 0] * scale <= base_time * (1 + 1e-9), 1].min()
    return f"{100 * (1 - raw / base_energy):.2f}", f"{100 * (1 - aligned / base_energy):.2f}"


def perseus_table(lines: list[str], Ms: list[int]) -> None:
    lines += ["## Savings at no slowdown vs Perseus and EnvPipe",
              "",
              "Energy saving against the 1F1B all-max plan, iteration time <= the 1F1B all-max time, "
              "simulated on the measured profile (Perseus's idle power: 83.64 W A100, 70.38 W A40). "
              "*Perseus (ref)*: its frontier's least energy with its own time <= the exact all-max time (the "
              "README's reference; its 1 ms rounding puts its times 0.6-0.7% low, so these plans are really "
              "slightly slower). *Perseus (aligned)*: the same after scaling its time axis so its fastest "
              "point equals the exact all-max time. *EnvPipe*: envelope+balanced on the EnvPipe schedule "
              "(its own slowdown shown). *optimal 1F1B*: our planner on the 1F1B order; *LP bound 1F1B*: no 1F1B "
              "plan within the exact all-max time can save more (docs/optimal-planner.md). *optimal envpipe*: "
              "our planner trying EnvPipe's warm-up counts r_s and plain 1F1B, keeping the better. "
              "*optimal @EnvPipe time*: the same with EnvPipe's own iteration time as the budget.",
              "",
              "| profile | M | Perseus (ref) % | Perseus (aligned) % | EnvPipe % (slowdown %) | optimal 1F1B % "
              "| LP bound 1F1B % | optimal envpipe % | optimal @EnvPipe time % | chosen r_s "
              "| plan time (s, measured) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in PROFILES:
        for M in Ms:
            case = PipelineCase.of(real_profile(name), M, BLOCKING_POWER_W[name])
            cells, base, env_sched, et = compared_cells(name, case)
            bt, be = base.iteration_time, base.energy
            at_env = optimal_plan(case, "envpipe", max(et, bt))
            _, ae = resimulated(at_env.plan, case)
            ref, aligned = perseus_savings(name, M, bt, be)
            lines.append(f"| {name} | {M} | {ref} | {aligned} | {' | '.join(cells[:4])} | {100 * (1 - ae / be):.2f} "
                         f"| {env_sched.reschedule} | {cells[4]} |")
    lines.append("")


def compared_cells(name: str, case: PipelineCase) -> tuple[list[str], Timeline, Planned, float]:
    """The cells every savings table shares: EnvPipe % (slowdown %) of its envelope+balanced plan, optimal 1F1B %,
    LP bound 1F1B %, optimal envpipe % (the planner over both orders) and that plan's measured planning time;
    with the 1F1B all-max baseline, the optimal envpipe result and EnvPipe's iteration time for the other cells."""
    one = optimal_plan(case, "1f1b")
    t0 = time.perf_counter()
    both = optimal_plan(case, "envpipe")
    wall = time.perf_counter() - t0
    env = make_plan(case)
    bt, be = one.baseline.iteration_time, one.baseline.energy
    savings = []
    for plan in (one.plan, both.plan):
        t, e = resimulated(plan, case)
        assert t <= bt * (1 + 1e-9), f"{name} M={case.num_microbatches}: plan over budget ({t} > {bt})"
        savings.append(f"{100 * (1 - e / be):.2f}")
    et, ee = resimulated(env.plan, case)
    cells = [f"{100 * (1 - ee / be):.2f} ({100 * (et / bt - 1):.1f})", savings[0],
             f"{100 * (1 - lp_bound(case, bt) / be):.2f}", savings[1], f"{wall:.2f}"]
    return cells, one.baseline, both, et


def lp_bound(case: PipelineCase, budget_s: float) -> float:
    """The full (unfolded) LP's value on the 1F1B order: a lower bound on any 1F1B plan within the budget."""
    problem = build_problem(case, "1f1b", [0] * case.num_stages)
    return solve_relaxation(problem.menus, problem.edges, budget_s, identity_fold(problem.dag.num_units)).energy


def other_profiles_table(lines: list[str]) -> None:
    lines += ["## Other real profiles (Perseus artifact, not the shared ones)", "",
              "Same columns as above, on the other two shipped profiles (8 stages; BLOOM's last stage is lighter, "
              "GPT-3/A40's heavier and its curves are not monotone at the top clocks). Perseus (ref) as above, from "
              "its published frontiers (its BLOOM/A100 times are rounded to 1 ms, GPT-3/A40 to 0.1 ms).", "",
              "| profile | M | Perseus (ref) % | EnvPipe % (slowdown %) | optimal 1F1B % | LP bound 1F1B % "
              "| optimal envpipe % | plan time (s, measured) |", "|---|---|---|---|---|---|---|---|"]
    for (name, M), perseus in PERSEUS_OTHER.items():
        cells, base, _, _ = compared_cells(name, PipelineCase.of(real_profile(name), M, BLOCKING_POWER_W[name]))
        lines.append(f"| {name} | {M} | {100 * (1 - perseus / base.energy):.2f} | {' | '.join(cells)} |")
    lines.append("")


def gap(ours: float, exact: float, baseline: float) -> float:
    """Share of the exact optimum's saving that the planner misses."""
    return ((baseline - exact) - (baseline - ours)) / (baseline - exact)


def milp_table(lines: list[str], random_cases: int, envpipe_cases: int) -> None:
    lines += ["## Gap to the exact MILP (small cut-downs of the real profiles)", "",
              "4 stages x 8 micro-batches, 8 clocks spread over the profile's range, 1F1B order; savings simulated "
              "on the cut-down measured profile. Relative gap = share of the MILP's saving that the planner misses.",
              "", "| profile | slowdown | MILP saving % | optimal saving % | relative gap | LP bound % |",
              "|---|---|---|---|---|---|"]
    for name in BLOCKING_POWER_W:
        full, watts = real_profile(name), BLOCKING_POWER_W[name]
        case = PipelineCase.of(cut_down(full, [0, 1, 2, 3], spread_clocks(full, 8)), 8, watts)
        for slow in (0.0, 0.01, 0.03, 0.1):
            res = optimal_plan(case, "1f1b", max_slowdown=slow)
            assert res.budget_s is not None
            try:
                exact = exact_energy(case, "1f1b", res.budget_s, node_limit=EXACT_NODES)
            except MilpUnsolved:
                lines.append(f"| {name} | {slow:.0%} | MILP not solved in {EXACT_NODES:,} nodes | | | |")
                continue
            be = res.baseline.energy
            lines.append(f"| {name} | {slow:.0%} | {100 * (1 - exact / be):.2f} | "
                         f"{100 * (1 - res.timeline.energy / be):.2f} | {gap(res.timeline.energy, exact, be):.4f} | "
                         f"{100 * (1 - (res.bound_j or np.nan) / be):.2f} |")
    gaps, skipped, worse, compared, plan_s = [], 0, 0, 0, []
    for seed in range(random_cases):
        drawn = random_case(seed)
        t0 = time.perf_counter()
        res = optimal_plan(drawn.case, drawn.schedule, max_slowdown=drawn.slowdown)
        plan_s.append(time.perf_counter() - t0)
        assert res.budget_s is not None
        try:
            exact = exact_energy(drawn.case, drawn.schedule, res.budget_s, node_limit=RANDOM_NODES)
        except MilpUnsolved:
            skipped += 1
            continue
        gaps.append(gap(resimulated(res.plan, drawn.case)[1], exact, res.baseline.energy))
        if seed < envpipe_cases:
            worse += envpipe_losses(drawn)
            compared += len(POLICIES) * len(RECONFIGS)
    g = np.asarray(gaps)
    lines += ["", f"**Random cut-downs** (envpipe.plan.instances `random_case(seed)`, seeds 0-{random_cases - 1}: "
              "one of the four real profiles, 2-4 of its stages, 4-8 of its clocks, M in {4, 6, 8}, slowdown 0 or "
              "0-10%, 1F1B or the EnvPipe schedule (the MILP then takes the best of the same candidate orders)): "
              f"{g.size} cases solved by the MILP within {RANDOM_NODES:,} branch-and-bound nodes ({skipped} skipped); "
              f"relative gap max {g.max():.4f}, "
              f"mean {g.mean():.5f}, {int((g > 0.005).sum())} cases above 0.005; planner time per case "
              f"median {np.median(plan_s):.2f} s, max {max(plan_s):.2f} s (measured).",
              f"Against EnvPipe's policies at their own iteration time (baseline/uniform/envelope x "
              f"default/greedy/balanced, on the first {envpipe_cases} seeds): {worse} of {compared} comparisons worse.",
              ""]


def envpipe_losses(case: Case) -> int:
    """How many EnvPipe policy variants beat the planner at their own iteration time (should be 0)."""
    losses = 0
    for policy in POLICIES:
        # the baseline policy ignores the reconfiguration: plan it once and count it for each
        variants = [(RECONFIGS[0], len(RECONFIGS))] if policy == "baseline" else [(r, 1) for r in RECONFIGS]
        for reconfig, count in variants:
            env = make_plan(case.case, case.schedule, policy, Reconfig(reconfig))
            try:
                ours = optimal_plan(case.case, case.schedule, env.timeline.iteration_time)
            except InfeasibleBudget:
                losses += count
                continue
            losses += count * int(ours.timeline.energy > env.timeline.energy * (1 + 1e-9))
    return losses


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def speed_table(lines: list[str], quick: bool) -> None:
    name = "gpt3-175b+a100_sxm_bf16"
    prof, W = real_profile(name), BLOCKING_POWER_W[name]
    case = PipelineCase.of(prof, 96, W)
    rows = [
        ("S=8, M=96, 38 clocks: one plan, 1F1B order", lambda: optimal_plan(case)),
        ("S=8, M=96, 38 clocks: one plan, envpipe schedule (2 orders)", lambda: optimal_plan(case, "envpipe")),
        ("S=8, M=96, 38 clocks: frontier, 20 points, 1F1B order", lambda: frontier(case, points=20)),
        ("S=8, M=96, 38 clocks: frontier, 20 points, envpipe schedule (2 orders)",
         lambda: frontier(case, "envpipe", points=20)),
    ]
    if not quick:
        big = PipelineCase.of(prof.with_stages(32), 256, W)
        rows.append(("S=32 (tiled), M=256, 38 clocks: one plan, 1F1B order", lambda: optimal_plan(big)))
    lines += ["## Speed (measured wall time of the planner on this machine)", "", "| case | seconds |", "|---|---|"]
    for label, fn in rows:
        lines.append(f"| {label} | {timed(fn):.2f} |")
    lines += ["", "### Scaling (one plan, 1F1B order, no slowdown; stages tiled from the measured GPT-3/A100 "
              "profile, clocks thinned evenly)", "", "| S | M | clocks | units | seconds |", "|---|---|---|---|---|"]
    grid = [(8, 24, 38), (8, 48, 38), (8, 96, 38), (8, 192, 38), (4, 96, 38), (16, 96, 38),
            (8, 96, 8), (8, 96, 16)]
    if not quick:
        grid += [(16, 128, 38), (32, 128, 38)]
    for S, M, K in grid:
        p = prof.with_stages(S)
        p = p.restricted(p.freqs[spread_clocks(p, K)])
        seconds = timed(lambda p=p, M=M: optimal_plan(PipelineCase.of(p, M, W)))
        lines.append(f"| {S} | {M} | {K} | {2 * S * M} | {seconds:.2f} |")
    lines.append("")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="skip the largest cases")
    add_output_options(ap, "optimal.md")


def run(args: argparse.Namespace) -> None:
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = ["# Optimal planner benchmark", "", f"Written by `{args.command}`.", "",
             f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
             f"- machine: `{uname}`, nproc {nproc}, Python {platform.python_version()}",
             "- energies and iteration times: simulated on the measured profiles (envpipe/profile/data), "
             "after a plan JSON round trip; run times: measured.", ""]
    perseus_table(lines, [12, 24, 48, 96])
    other_profiles_table(lines)
    milp_table(lines, 20 if args.quick else 100, 10 if args.quick else 40)
    speed_table(lines, args.quick)
    lines.insert(7, f"- load average (1, 5, 15 min) at the start: {load_start}; at the end: "
                    f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (other jobs share this machine's CPUs)")
    print("\n".join(lines))
    write_results(args, "\n".join(lines))

"""The optimal planner at the scale of real jobs: where its time goes, its speed against an older version
side by side, its scaling (with the load during each case and the gap to the exact MILP where that finishes),
the documented limits, the CLI's start-up, and that its savings did not change.

Writes a new dated file beside benchmarks/results/planner_scale.md (`--update` overwrites that one). Run
times are *measured* on this machine (with its load noted); energies are *simulated* on the measured
profiles. A reference checkout (an older commit) is timed in the same run, case by case alternating with
this tree, each case in a fresh process, so both see the same load:

    git archive <old-commit> envpipe tests/plan | tar -x -C /tmp/planner_ref
    python benchmarks/planner_results.py scale --reference /tmp/planner_ref [--quick] [--update]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import ROOT, add_output_options, header, write_results

GPT3, W = "gpt3-175b+a100_sxm_bf16", 83.64
# (label, what, stages, micro-batches, schedule): what is "plan" (one plan) or "frontier" (20 points)
SPEED = [("S=8, M=96, one plan, 1F1B order", "plan", 8, 96, "1f1b"),
         ("S=8, M=96, one plan, EnvPipe orders", "plan", 8, 96, "envpipe"),
         ("S=8, M=96, 20-point frontier, 1F1B order", "frontier", 8, 96, "1f1b"),
         ("S=8, M=96, 20-point frontier, EnvPipe orders", "frontier", 8, 96, "envpipe"),
         ("S=16, M=256, one plan, 1F1B order", "plan", 16, 256, "1f1b"),
         ("S=32, M=256, one plan, EnvPipe orders", "plan", 32, 256, "envpipe"),
         ("S=64, M=1024, one plan, 1F1B order", "plan", 64, 1024, "1f1b")]
SCALING = [(4, 8), (4, 16), (8, 24), (8, 48), (8, 96), (8, 192), (16, 128), (16, 256), (32, 256), (32, 512),
           (64, 1024)]
# the planner's documented limits (envpipe.limits): the largest LPs it takes (MAX_LP_UNITS), EnvPipe's orders (two
# LPs) included, on both shipped profiles' tilings; 1,024 x 64 (the unit cap, MAX_UNITS) is refused in one line
LIMITS = [(GPT3, 64, 1024, "1f1b"), (GPT3, 64, 1024, "envpipe"), ("bloom+a40_bf16", 64, 1024, "envpipe"),
          (GPT3, 128, 96, "envpipe"), ("bloom+a40_bf16", 128, 96, "envpipe"), (GPT3, 256, 48, "envpipe"),
          ("bloom+a40_bf16", 256, 48, "envpipe"), (GPT3, 1024, 12, "envpipe"), (GPT3, 128, 128, "envpipe"),
          (GPT3, 1024, 64, "envpipe")]
MILP_UNITS = 1536  # the exact MILP is tried up to this many units ...
MILP_NODES = 20_000  # ... with this many branch-and-bound nodes, in a process given MILP_TIMEOUT_S
MILP_TIMEOUT_S = 120.0


def planners(watts: float) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``plan(profile, M, schedule, max_slowdown)`` and ``sweep(profile, M, schedule, points)`` (a list of plans) on
    the planner of the ``envpipe`` on sys.path: this tree's, or a reference from before the planning case
    (envpipe.plan.case, 2026-11-25), whose planners took the profile and the idle power as arguments."""
    try:  # the optimal family in its folder (2026-11-28), or a reference from before, where it was flat in plan/
        frontier = importlib.import_module("envpipe.plan.optimal.frontier").frontier
        optimal_plan = importlib.import_module("envpipe.plan.optimal.orders").optimal_plan
    except ImportError:
        frontier = importlib.import_module("envpipe.plan.frontier").frontier
        optimal_plan = importlib.import_module("envpipe.plan.optimal").optimal_plan
    try:
        from envpipe.plan.case import PipelineCase
    except ImportError:
        return (lambda p, M, schedule="1f1b", slowdown=None: optimal_plan(p, M, idle_power_w=watts, schedule=schedule,
                                                                          max_slowdown=slowdown),
                lambda p, M, schedule, points: [x.plan for x in frontier(p, M, idle_power_w=watts, schedule=schedule,
                                                                          points=points)])
    return (lambda p, M, schedule="1f1b", slowdown=None: optimal_plan(PipelineCase.of(p, M, watts), schedule,
                                                                      max_slowdown=slowdown),
            lambda p, M, schedule, points: [x.plan for x in frontier(PipelineCase.of(p, M, watts), schedule, points)])


def worker(what: str, stages: int, micro: int, schedule: str) -> dict[str, float]:
    """One case in this process (run through in_child), on the planner of sys.path[0]'s tree: wall seconds (imports
    excluded) and saving %."""
    from envpipe.profile import embedded_profile_path, load_profile

    plan, sweep = planners(W)
    prof = load_profile(embedded_profile_path(GPT3)).with_stages(stages)
    plan(prof.with_stages(2), 4)  # lazy imports and caches out of the timing
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    if what == "frontier":
        last = sweep(prof, micro, schedule, 20)[-1].predicted
        energy, base = last["energy_j"], last["baseline_energy_j"]
    else:
        res = plan(prof, micro, schedule)
        energy, base = res.timeline.energy, res.baseline.energy
    return {"seconds": time.perf_counter() - t0, "saving_pct": 100 * (1 - energy / base), "load_before": load_before,
            "load_after": os.getloadavg()[0]}


def in_child(function: str, *args: object, tree: Path = ROOT, timeout_s: float | None = None) -> Any:
    """``function(*args)``, a function of this module, in a fresh Python process whose ``envpipe`` is ``tree``'s
    (this checkout's benchmarks after it on sys.path): what it returned, printed as JSON. Past ``timeout_s``:
    subprocess.TimeoutExpired."""
    code = (f"import json, sys; sys.path[:0] = [{str(tree)!r}, {str(ROOT)!r}]; "
            f"from benchmarks.planner_study.scale import {function}; print(json.dumps({function}(*{args!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=True,
                         cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_case(tree: Path, case: tuple[str, int, int, str], timeout_s: float) -> dict[str, float] | None:
    """The case in a fresh process on ``tree`` (None if it ran past ``timeout_s``)."""
    try:
        return dict(in_child("worker", *case, tree=tree, timeout_s=timeout_s))
    except subprocess.TimeoutExpired:
        return None


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


@contextmanager
def phase_clock() -> Iterator[dict[str, float]]:
    """Seconds spent in each phase of envpipe.plan.optimal.solve while the block runs (this tree only)."""
    from envpipe.plan.optimal import solve

    spent: dict[str, float] = {}
    names = {"solve_relaxation": "LP (build + HiGHS)", "_diffused": "rounding", "_nearest": "rounding",
             "_on_time": "rounding",
             "_repair": "repair", "_improve": "free-float improve", "_polish": "MILP polish"}
    originals = {name: getattr(solve, name) for name in names}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[names[name]] = spent.get(names[name], 0.0) + time.perf_counter() - t0
        return wrapper

    for name, fn in originals.items():
        setattr(solve, name, timed(name, fn))
    try:
        yield spent
    finally:
        for name, fn in originals.items():
            setattr(solve, name, fn)


def profile_table(lines: list[str], cases: list[tuple[str, str, int, int, str]]) -> None:
    from envpipe.plan.case import PipelineCase
    from envpipe.plan.optimal.orders import optimal_plan
    from envpipe.profile import embedded_profile_path, load_profile

    lines += ["## Where the time goes (this tree, one plan)", "",
              "Seconds per phase of `solve` (repair includes its simulations; `rest` is order and DAG building, "
              "menus, the fold, baselines and final simulations). Measured.", "",
              "| case | total | LP (build + HiGHS) | rounding | repair | free-float improve | MILP polish | rest |",
              "|---|---|---|---|---|---|---|---|"]
    phases = ["LP (build + HiGHS)", "rounding", "repair", "free-float improve", "MILP polish"]
    prof = load_profile(embedded_profile_path(GPT3))
    for label, what, S, M, schedule in cases:
        if what != "plan":
            continue
        with phase_clock() as spent:
            t0 = time.perf_counter()
            optimal_plan(PipelineCase.of(prof.with_stages(S), M, W), schedule)
            total = time.perf_counter() - t0
        cells = [f"{spent.get(p, 0.0):.2f}" for p in phases]
        lines.append(f"| {label} | {total:.2f} | {' | '.join(cells)} | {total - sum(spent.values()):.2f} |")
    lines.append("")


def speed_table(lines: list[str], reference: Path | None, cases: list[tuple[str, str, int, int, str]],
                ref_timeout_s: float) -> None:
    lines += ["## Speed against the reference, side by side (measured)", "",
              "Each cell is one fresh process; this tree and the reference alternate case by case. The saving "
              "(simulated, against the 1F1B all-max plan; a frontier's: its last point) shows the result did not "
              "get worse for being faster.", "",
              "| case | before (s) | after (s) | speed-up | saving before % | saving after % | load (1 min) |",
              "|---|---|---|---|---|---|---|"]
    for label, what, S, M, schedule in cases:
        before = (run_case(reference, (what, S, M, schedule), ref_timeout_s)
                  if reference is not None and 2 * S * M <= 16384 else None)
        after = run_case(ROOT, (what, S, M, schedule), 3600)
        assert after is not None
        old_s = "not run" if before is None else f"{before['seconds']:.2f}"
        if reference is not None and before is None and 2 * S * M <= 16384:
            old_s = f"> {ref_timeout_s:.0f}"
        ratio = "" if before is None else f"{before['seconds'] / after['seconds']:.1f}x"
        old_save = "" if before is None else f"{before['saving_pct']:.2f}"
        lines.append(f"| {label} | {old_s} | {after['seconds']:.2f} | {ratio} | {old_save} | "
                     f"{after['saving_pct']:.2f} | {os.getloadavg()[0]:.1f} |")
    lines.append("")


def scaling_table(lines: list[str]) -> None:
    lines += ["## Scaling (this tree; one plan, 1F1B order, no slowdown, 38 clocks, stages tiled from the measured "
              "GPT-3/A100 profile; measured)", "",
              f"Each size in a fresh process; the load average (1 min) when it started and ended. Gap: the share of "
              f"the exact MILP's saving the plan misses, where the MILP (envpipe.plan.optimal.milp, up to "
              f"{MILP_UNITS:,} units, {MILP_NODES:,} branch-and-bound nodes, in a process given "
              f"{MILP_TIMEOUT_S:.0f} s) proves its optimum; LP gap: the same against the LP's bound (the whole LP, "
              "up to 8,192 units: a bound the "
              "optimum may not reach).", "",
              "| S | M | units N | seconds | load (start, end) | MILP gap | LP gap |", "|---|---|---|---|---|---|---|"]
    sizes, seconds = [], []
    for S, M in SCALING:
        res = run_case(ROOT, ("plan", S, M, "1f1b"), 3600)
        assert res is not None
        sizes.append(2 * S * M)
        seconds.append(res["seconds"])
        milp, lp = gaps(S, M)
        lines.append(f"| {S} | {M} | {2 * S * M} | {res['seconds']:.2f} | {res['load_before']:.1f}, "
                     f"{res['load_after']:.1f} | {milp} | {lp} |")
    slope = np.polyfit(np.log(sizes), np.log(seconds), 1)[0]
    lines += ["", f"Fitted exponent (least squares of log seconds on log N over these sizes): **{slope:.2f}** "
              "(time ~ N^exponent).", ""]


def gaps(stages: int, micro: int) -> tuple[str, str]:
    """The plan's gap to the exact MILP (or why there is none) and to the LP bound, as table cells."""
    try:
        found = in_child("gap_worker", stages, micro, 2 * stages * micro <= MILP_UNITS, timeout_s=MILP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"not finished in {MILP_TIMEOUT_S:.0f} s", ""
    return str(found["milp"]), str(found["lp"])


def gap_worker(stages: int, micro: int, try_milp: bool) -> dict[str, str]:
    """In this process: the plan's relative gap to the exact MILP and to the whole LP's bound (1F1B order)."""
    from envpipe.plan.case import PipelineCase
    from envpipe.plan.optimal.fold import identity_fold
    from envpipe.plan.optimal.lp import solve_relaxation
    from envpipe.plan.optimal.milp import MilpUnsolved, solve_milp
    from envpipe.plan.optimal.orders import optimal_plan
    from envpipe.plan.optimal.problem import build_problem
    from envpipe.profile import embedded_profile_path, load_profile

    case = PipelineCase.of(load_profile(embedded_profile_path(GPT3)).with_stages(stages), micro, W)
    res = optimal_plan(case, "1f1b")
    assert res.budget_s is not None
    base, ours = res.baseline.energy, res.timeline.energy

    def gap(exact: float) -> str:
        return f"{((base - exact) - (base - ours)) / (base - exact):.4f}"

    problem = build_problem(case, "1f1b", [0] * stages)
    lp = ""
    if problem.dag.num_units <= 8192:
        lp = gap(solve_relaxation(problem.menus, problem.edges, res.budget_s,
                                  identity_fold(problem.dag.num_units)).energy)
    if not try_milp:
        return {"milp": f"not tried (> {MILP_UNITS:,} units)", "lp": lp}
    try:
        option, _ = solve_milp(problem.menus, problem.edges, res.budget_s, MILP_NODES)
    except MilpUnsolved:
        return {"milp": f"not proved in {MILP_NODES:,} nodes", "lp": lp}
    return {"milp": gap(problem.simulate(option).energy), "lp": lp}


def limits_table(lines: list[str]) -> None:
    """The documented limits: the largest LPs the planner takes, on both shipped profiles' tilings, and the unit
    cap (1,024 x 64), refused in one line; each in a fresh `envpipe plan` process, wall clock."""
    lines += ["## At the documented limits (this tree; `envpipe plan`, one plan at no slowdown; measured)", "",
              "Each a fresh `envpipe plan` process (start-up, profile, plan, output: the wall clock a user waits), "
              "stages tiled from the shipped profile; the load average (1 min) when it started and ended. "
              "envpipe.limits: at most 131,072 units, and at most 24,576 in an order's LP (the units that do not "
              "repeat).", "",
              "| profile | S x M | schedule | seconds | load (start, end) | outcome |", "|---|---|---|---|---|---|"]
    for name, S, M, schedule in LIMITS:
        watts = "83.64" if name == GPT3 else "70.38"
        with tempfile.TemporaryDirectory() as tmp:
            before = os.getloadavg()[0]
            t0 = time.perf_counter()
            proc = subprocess.run([str(Path(sys.executable).parent / "envpipe"), "plan", "--profile",
                                   str(ROOT / "envpipe" / "profile" / "data" / f"{name}.csv"), "--stages", str(S),
                                   "-m", str(M), "--schedule", schedule, "--blocking-power", watts,
                                   "--out", str(Path(tmp) / "plan.json")],
                                  capture_output=True, text=True, cwd=ROOT, timeout=3600)
            seconds = time.perf_counter() - t0
        saving = [line for line in proc.stdout.splitlines() if "energy saving" in line]
        outcome = (saving[0].strip() if proc.returncode == 0 and saving
                   else " ".join(proc.stderr.strip().splitlines()[-1:]).replace("|", "/"))
        lines.append(f"| {name} | {S} x {M} | {schedule} | {seconds:.1f} | {before:.1f}, {os.getloadavg()[0]:.1f} "
                     f"| {outcome} |")
    lines.append("")


def startup_table(lines: list[str], reference: Path | None) -> None:
    def median_startup(tree: Path) -> float:
        code = f"import sys; sys.path.insert(0, {str(tree)!r}); from envpipe.cli import main; main()"
        runs = []
        for _ in range(7):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, check=True, cwd=tree)
            runs.append(time.perf_counter() - t0)
        return float(np.median(runs))

    lines += ["## CLI start-up (`envpipe --help`, median of 7 fresh processes, wall seconds; measured)", ""]
    if reference is not None:
        lines.append(f"- before: {median_startup(reference):.2f} s")
    lines += [f"- after: {median_startup(ROOT):.2f} s (scipy is imported only when the optimal planner runs)", ""]


def savings_table(lines: list[str], reference: Path) -> None:
    """This tree's and the reference's savings on the 16 Perseus cases (and the other real profiles) and the
    4 x 8 x 8 MILP cut-downs, each tree in its own process, on the same profile files (written here by this
    tree, so a reference from before envpipe.plan.instances plans the same cases)."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_cases(Path(tmp))
        before, after = (in_child("savings", str(manifest), tree=tree) for tree in (reference, ROOT))
    diffs = {k: after[k] - before[k] for k in before}
    worst = min(diffs, key=lambda k: diffs[k])
    lines += ["## Savings unchanged (simulated)", "",
              "Energy saving at no slowdown against the 1F1B all-max plan (4 x 8 x 8 cut-downs: at 0, 1, 3 and 10% "
              "slowdown), before and after, on the four real profiles; difference in points.", "",
              "| case | before % | after % | difference |", "|---|---|---|---|"]
    lines += [f"| {k} | {before[k]:.3f} | {after[k]:.3f} | {diffs[k]:+.3f} |" for k in before]
    lines += ["", f"Largest loss: {diffs[worst]:+.3f} points ({worst}); largest gain: {max(diffs.values()):+.3f}.", ""]


def write_cases(folder: Path) -> Path:
    """Each shipped profile and its 4-stage x 8-clock cut-down as CSV files, and a manifest naming them."""
    from envpipe.plan.instances import BLOCKING_POWER_W, cut_down, real_profile, spread_clocks

    cases = []
    for name, watts in BLOCKING_POWER_W.items():
        prof = real_profile(name)
        full, small = folder / f"{name}.csv", folder / f"{name}.4x8.csv"
        prof.to_csv(full)
        cut_down(prof, [0, 1, 2, 3], spread_clocks(prof, 8)).to_csv(small)
        cases.append({"name": name, "watts": watts, "full": str(full), "small": str(small)})
    manifest = folder / "cases.json"
    manifest.write_text(json.dumps(cases))
    return manifest


def savings(manifest: str) -> dict[str, float]:
    """Savings of the planner on sys.path[0]'s tree (run through in_child) on the cases in ``manifest``."""
    from envpipe.profile import load_profile

    out = {}
    for case in json.loads(Path(manifest).read_text()):
        name = case["name"]
        plan, _ = planners(case["watts"])
        prof = load_profile(case["full"])
        for M in (12, 24, 48, 96):
            for schedule in ("1f1b", "envpipe"):
                res = plan(prof, M, schedule)
                out[f"{name} M={M} {schedule}"] = 100 * (1 - res.timeline.energy / res.baseline.energy)
        small = load_profile(case["small"])
        for slowdown in (0.0, 0.01, 0.03, 0.1):
            res = plan(small, 8, "1f1b", slowdown)
            out[f"{name} 4x8x8 slowdown {slowdown:.0%}"] = 100 * (1 - res.timeline.energy / res.baseline.energy)
    return out


def checkout(text: str) -> Path:
    """--reference: a tree with an envpipe package in it (`git archive <old-commit> envpipe tests/plan`)."""
    path = Path(text)
    if not (path / "envpipe" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text}: no envpipe package in it "
                                         "(make one: git archive OLD-COMMIT envpipe tests/plan | tar -x -C REF)")
    return path


def seconds(text: str) -> float:
    value = float(text)  # not a number: argparse's one-line error
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds above 0")
    return value


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--reference", type=checkout, default=None, help="an older checkout to time side by side")
    ap.add_argument("--reference-timeout", type=seconds, default=300.0,
                    help="seconds before a reference case is cut")
    ap.add_argument("--quick", action="store_true",
                    help="skip the two largest cases, the scaling table and the limits")
    add_output_options(ap, "planner_scale.md")


def run(args: argparse.Namespace) -> None:
    cases = SPEED[:-2] if args.quick else SPEED
    lines = [header("Optimal planner at scale", args.command).rstrip(), "",
             f"- load average (1, 5, 15 min) at the start: {load()}",
             "- run times: measured here; energies: simulated on the measured profiles (envpipe/profile/data).", ""]
    profile_table(lines, cases)
    speed_table(lines, args.reference, cases, args.reference_timeout)
    startup_table(lines, args.reference)
    if not args.quick:
        scaling_table(lines)
        limits_table(lines)
    if args.reference is not None:
        savings_table(lines, args.reference)
    lines.insert(4, f"- load average at the end: {load()} (other jobs share this machine's 2 CPUs)")
    print("\n".join(lines))
    write_results(args, "\n".join(lines))

"""EnvPipe policies on the two real measured profiles, and planning speed.

All times and energies here are SIMULATED on real measured stage profiles (Perseus artifact):
the planner's simulator, not a GPU run. Planning wall time is measured on this machine.
`python benchmarks/planner_results.py policies [--update | --out FILE]` writes a new dated file beside
benchmarks/results/planner.md (`--update` overwrites that one).
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import add_output_options, header, write_results
from envpipe.plan.case import PipelineCase
from envpipe.plan.planner import make_plan
from envpipe.plan.reconfig import Reconfig
from envpipe.profile import embedded_profile_path, load_profile

PROFILES = {"gpt3-175b+a100_sxm_bf16": (83.64, "a100"), "bloom+a40_bf16": (70.38, "all")}
CONFIGS = [("1f1b", "baseline", "default"), ("1f1b", "uniform", "default"), ("envpipe", "envelope", "default"),
           ("envpipe", "envelope", "greedy"), ("envpipe", "envelope", "balanced")]


def timed_plan(profile, m, schedule, policy, reconfig, idle, gpu):
    t0 = time.perf_counter()
    r = make_plan(PipelineCase.of(profile, m, idle), schedule, policy, Reconfig(reconfig), gpu)
    return r, time.perf_counter() - t0


def policy_table() -> str:
    rows = ["| profile | M | schedule | policy | iteration (s) | energy (J) | saving % | slowdown % | "
            "reconfig rounds | plan wall (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, (idle, gpu) in PROFILES.items():
        profile = load_profile(embedded_profile_path(name))
        for m in (12, 24, 48, 96):
            for schedule, policy, reconfig in CONFIGS:
                r, wall = timed_plan(profile, m, schedule, policy, reconfig, idle, gpu)
                pr = r.plan.predicted
                saving = 100 * (1 - pr["energy_j"] / pr["baseline_energy_j"])
                slow = 100 * (pr["iteration_time_s"] / pr["baseline_time_s"] - 1)
                rows.append(f"| {name} | {m} | {schedule} | {r.plan.policy} | {pr['iteration_time_s']:.3f} | "
                            f"{pr['energy_j']:.0f} | {saving:.2f} | {slow:.2f} | {r.reconfig_rounds} | {wall:.3f} |")
                print(rows[-1], flush=True)
    return "\n".join(rows)


def speed_table() -> str:
    rows = ["| stages | M | policy | reconfig rounds | plan + simulate wall (s) | target |",
            "|---|---|---|---|---|---|"]
    base = load_profile(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))
    for S, m, target in ((8, 96, 0.2), (64, 1024, 5.0)):
        profile = base.with_stages(S)
        for schedule, policy, reconfig in CONFIGS[2:]:
            if S > 8 and reconfig == "greedy":
                continue  # one simulated iteration per 90 MHz raise: tens of thousands of rounds at this size
            r, wall = timed_plan(profile, m, schedule, policy, reconfig, 83.64, "a100")
            ok = "met" if wall < target else "missed"
            rows.append(f"| {S} | {m} | {r.plan.policy} | {r.reconfig_rounds} | {wall:.3f} | < {target} s: {ok} |")
            print(rows[-1], flush=True)
    return "\n".join(rows)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_output_options(ap, "planner.md")


def run(args: argparse.Namespace) -> None:
    text = header("Planner benchmark: EnvPipe policies on real profiles (simulated) and planning speed (measured)",
                  args.command)
    text += ("\nEnergies and times are **simulated** by envpipe's simulator on the real measured profiles in "
             "envpipe/profile/data (Perseus artifact), with Perseus's blocking power (83.64 W A100, 70.38 W A40); "
             "candidate clocks: EnvPipe's A100 filter for GPT-3 (plus 1410 MHz), every clock for BLOOM/A40 "
             "(EnvPipe has no A40 filter). Saving and slowdown are against 1F1B with every unit at the highest "
             "clock. Planning wall time is **measured** on the machine above.\n\n## Policies\n\n")
    text += policy_table()
    text += ("\n\n## Planning speed\n\nS=64 tiles the 8 measured GPT-3 stages cyclically (a what-if size, not a "
             "measurement). Greedy and balanced run one simulated iteration per reconfiguration round, as EnvPipe "
             "runs one training iteration per round; their cost grows with the number of rounds (greedy is not run at "
             "S=64: one 90 MHz raise per round needs tens of thousands of rounds there).\n\n")
    text += speed_table() + "\n"
    write_results(args, text)

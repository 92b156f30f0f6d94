"""Pipeline schedules side by side: iteration time, bubble share, peak in-flight activations and the energy the
optimal planner saves at no slowdown, on the two shared profiles.

Writes a new dated file beside benchmarks/results/schedules.md (`--update` overwrites that one). Every
number is *simulated* on the measured profile (8 stages); interleaved 1F1B and DualPipeV split each
measured stage evenly over its chunks (docs/planner.md), so all schedules run the same model and the same
total work, and energies compare across rows. Planner run times are measured.

    python benchmarks/planner_results.py schedules [--microbatches 32] [--update | --out FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import replace

import numpy as np

from benchmarks.common import add_output_options, header, write_results
from envpipe.plan.case import PipelineCase
from envpipe.plan.memory import peak_in_flight
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.plan.optimal.problem import build_problem
from envpipe.plan.planner import make_plan
from envpipe.plan.schedules import schedule_layout
from envpipe.profile import embedded_profile_path, load_profile

PROFILES = {"gpt3-175b+a100_sxm_bf16": 83.64, "bloom+a40_bf16": 70.38}  # Perseus's blocking power, W
# (row label, schedule, chunks): EnvPipe's order is the planner's best of EnvPipe's warm-up counts and 1F1B
ROWS = [("GPipe", "gpipe", None), ("1F1B", "1f1b", None), ("EnvPipe order", "envpipe", None),
        ("interleaved 1F1B, v=2", "interleaved", 2), ("interleaved 1F1B, v=4", "interleaved", 4),
        ("DualPipeV (DeepSpeed)", "dualpipev", None)]


def table(name: str, watts: float, M: int) -> list[str]:
    prof = load_profile(embedded_profile_path(name))
    P = prof.num_stages
    lines = [f"## {name}, P = {P}, M = {M}, idle power {watts} W", "",
             "*all-max*: every unit at the highest clock. *bubble*: idle share of P x iteration time at all-max "
             f"(tutorial: (P-1)/(M+P-1) = {(P - 1) / (M + P - 1):.3f} for GPipe and 1F1B with equal stages). "
             "*peak in flight*: the most micro-batches' activations a stage holds (a chunk's count 1/v), the "
             "largest over stages and on stage 0 and P-1. *saving*: the optimal planner's, at no slowdown, against "
             "the row's own all-max plan (1F1B all-max for the one-chunk orders, whose budget it is). "
             "*vs 1F1B all-max*: the plan's energy against 1F1B all-max (same model, same total work). "
             "*at 1F1B's time*: the planner's saving against 1F1B all-max when the row may take as long as 1F1B "
             "all-max (the faster schedules spend their shorter bubble on lower clocks).", "",
             "| schedule | all-max time (s) | bubble | peak in flight (max; stage 0, P-1) | planned time (s) "
             "| saving % | vs 1F1B all-max % | at 1F1B's time % | plan time (s, measured) |",
             "|---|---|---|---|---|---|---|---|---|"]
    plain = PipelineCase.of(prof, M, watts)
    one_f_one_b = make_plan(plain, "1f1b", "baseline").timeline
    raised = []
    for label, schedule, chunks in ROWS:
        case = replace(plain, layout=schedule_layout(schedule, P, chunks))
        t0 = time.perf_counter()
        res = optimal_plan(case, schedule)  # no budget: no slowdown, or the order's all-max time where later
        seconds = time.perf_counter() - t0
        assert res.budget_s is not None
        if res.budget_s > res.baseline.iteration_time:
            raised.append(f"{label}: planned at its fastest time, {res.budget_s:.11f} s, "
                          f"{res.budget_s - res.baseline.iteration_time:.2g} s above the budget at no slowdown "
                          "(1F1B all-max), which it cannot meet.")
        v = res.plan.chunks
        if schedule == "envpipe":  # the chosen order (EnvPipe's warm-up counts r_s) with every unit at its fastest
            problem = build_problem(case, schedule, res.reschedule)
            allmax = problem.simulate(np.zeros(problem.dag.num_units, int))
        else:
            allmax = make_plan(case, schedule, "baseline").timeline
        bubble = allmax.idle_time.sum() / (P * allmax.iteration_time)
        peaks = [n / v for n in peak_in_flight(res.plan.chunk_orders() if v > 1 else res.plan.orders())]
        relaxed = optimal_plan(case, schedule, max(one_f_one_b.iteration_time, res.budget_s)).timeline.energy
        lines.append(f"| {label} | {allmax.iteration_time:.3f} | {bubble:.3f} | {max(peaks):g} ({peaks[0]:g}, "
                     f"{peaks[-1]:g}) | {res.timeline.iteration_time:.3f} | "
                     f"{100 * (1 - res.timeline.energy / res.baseline.energy):.2f} | "
                     f"{100 * (1 - res.timeline.energy / one_f_one_b.energy):.2f} | "
                     f"{100 * (1 - relaxed / one_f_one_b.energy):.2f} | {seconds:.2f} |")
    return [*lines, "", *([*raised, ""] if raised else [])]


def microbatches(text: str) -> int:
    """--microbatches: a multiple of every profile's stage count P (interleaving's), at least 2P (DualPipeV's)."""
    micro = int(text)  # not a number: argparse's one-line error
    stages = [load_profile(embedded_profile_path(name)).num_stages for name in PROFILES]
    if micro % math.lcm(*stages) or micro < 2 * max(stages):
        raise argparse.ArgumentTypeError(f"{micro}: give a multiple of {math.lcm(*stages)} (the profiles' stages), "
                                         f"at least {2 * max(stages)}")
    return micro


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--microbatches", type=microbatches, default=32, help="M (a multiple of P, at least 2P)")
    add_output_options(ap, "schedules.md")


def run(args: argparse.Namespace) -> None:
    lines = [header("Pipeline schedules: time, bubble, memory, energy (simulated)", args.command).rstrip(), "",
             f"- load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", ""]
    for name, watts in PROFILES.items():
        lines += table(name, watts, args.microbatches)
    print("\n".join(lines))
    write_results(args, "\n".join(lines))

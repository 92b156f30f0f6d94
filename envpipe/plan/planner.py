"""One entry point from a profile to a plan: schedule, policy, reconfiguration, prediction."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.plan.dag import PipelineDag
from envpipe.plan.layout import model_profile
from envpipe.plan.memory import StageMemory, warmup_caps
from envpipe.plan.planfile import Plan, baseline_timeline, plan_from_timeline, unit_costs
from envpipe.plan.policies import POLICIES, initial_clocks, valley_clocks
from envpipe.plan.reconfig import RECONFIGS, ReconfigResult, reconfigure
from envpipe.plan.schedules import build_schedule, plan_layout, reschedule_counts
from envpipe.plan.simulate import Timeline, simulate, stage_tails
from envpipe.profile import Profile
from envpipe.profile.gpus import candidate_clocks


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    timeline: Timeline
    baseline: Timeline
    candidates: list[int]
    valley_mhz: list[int]
    reschedule: list[int]
    reconfig: ReconfigResult


def make_plan(
    profile: Profile,
    num_microbatches: int,
    *,
    schedule: str = "envpipe",
    policy: str = "envelope",
    reconfig: str = "balanced",
    idle_power_w: float,
    gpu: str = "all",
    transfer_s: float = 0.0,
    memory: StageMemory | None = None,
    threshold_scale: float = 4.0,
    tail_s: float | np.ndarray | list[float] = 0.0,
    chunks: int | None = None,
    stages: int | None = None,
) -> PlanResult:
    """Plan one iteration of ``profile``'s pipeline with EnvPipe's method.

    ``memory``: activation bytes per in-flight micro-batch and bytes available per stage (None: no limit);
    EnvPipe's extra warm-up forwards are capped by it, an order that does not fit is a MemoryLimitError,
    and the plan reports each stage's peak activation bytes.
    ``tail_s``: each stage's work after its last unit (gradient all-reduce, optimizer step), one number or
    one per stage; it is part of every simulated iteration (valley sweep, reconfiguration, baseline).
    ``chunks``, ``stages``: the layout of interleaved 1F1B and DualPipeV (envpipe.plan.optimal.order_problems);
    EnvPipe's envelope is defined for one model stage per pipeline stage, so those take only the baseline
    policy (every unit at the highest clock): the simulation of the schedule.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if reconfig not in RECONFIGS:
        raise ValueError(f"unknown reconfiguration {reconfig!r}; choose one of {', '.join(RECONFIGS)}")
    layout = plan_layout(schedule, profile.num_stages if stages is None else stages, num_microbatches,
                         idle_power_w, chunks)
    if layout.chunks > 1 and policy != "baseline":
        raise ValueError(f"EnvPipe's {policy} policy needs one model stage per pipeline stage; plan {schedule} "
                         "with --policy baseline (simulation) or optimal")
    model = model_profile(profile, layout)
    M, S = num_microbatches, layout.num_stages
    tail = stage_tails(tail_s, S)
    candidates = candidate_clocks([int(f) for f in profile.freqs], gpu)
    if policy == "baseline":
        valley = [profile.f_max] * S
    else:
        valley = valley_clocks(profile, candidates, M, idle_power_w, policy == "uniform", transfer_s, tail)

    reschedule = [0] * S
    if schedule == "envpipe" and policy != "baseline":
        bwd_max = [profile.bwd_time[s, 0] for s in range(S)]
        fwd_opt = [profile.fwd_time[s, profile.freq_index(valley[s])] for s in range(S)]
        reschedule = reschedule_counts(bwd_max, fwd_opt, M, None if memory is None else warmup_caps(memory, S))
    orders = build_schedule(schedule, S, M, reschedule, chunks if layout.chunks > 1 else None)
    peak_bytes = None if memory is None else memory.check(orders, schedule, layout.chunks)
    dag = PipelineDag.from_orders(orders, M, layout)
    clock_index = np.zeros(profile.f_max + 1, int)  # MHz -> column of the profile
    clock_index[profile.freqs] = np.arange(profile.freqs.size)

    def simulate_freqs(freqs: np.ndarray, previous: Timeline | None, changed: np.ndarray | None) -> Timeline:
        dur, en = unit_costs(dag, model, clock_index[freqs])
        return simulate(dag, dur, en, idle_power_w, transfer_s, tail_s=tail, previous=previous, changed=changed)

    start = initial_clocks(policy, dag, profile.f_max, valley)
    method = "default" if policy == "baseline" else reconfig
    result = reconfigure(dag, start, profile.freqs, simulate_freqs, method, threshold_scale)
    baseline = baseline_timeline(profile, M, idle_power_w, transfer_s, tail, layout)
    name = policy if method == "default" else f"{policy}+{method}"
    plan = plan_from_timeline(result.timeline, result.freqs_mhz, schedule, name, baseline, peak_bytes)
    return PlanResult(plan, result.timeline, baseline, candidates, valley, reschedule, result)

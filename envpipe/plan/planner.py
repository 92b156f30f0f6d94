"""EnvPipe's method from a case to a plan: schedule, policy, reconfiguration, prediction."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from envpipe.plan.case import PipelineCase, Planned
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import baseline_timeline, plan_from_timeline, unit_costs
from envpipe.plan.memory import warmup_caps
from envpipe.plan.policies import POLICIES, initial_clocks, valley_clocks
from envpipe.plan.reconfig import Reconfig, reconfigure
from envpipe.plan.schedules import build_schedule, check_schedule, reschedule_counts
from envpipe.plan.simulate import Timeline, resimulate, simulate
from envpipe.profile.gpus import candidate_clocks


def make_plan(case: PipelineCase, schedule: str = "envpipe", policy: str = "envelope",
              reconfig: Reconfig | None = None, gpu: str = "all") -> Planned:
    """Plan one iteration of ``case`` with EnvPipe's method: ``policy`` (baseline | uniform | envelope) on
    ``schedule``, then ``reconfig`` (default: balanced) on simulated waits; clocks among ``gpu``'s candidates
    (EnvPipe's per-GPU filter; "all": every clock of the profile).

    The case's memory caps EnvPipe's extra warm-up forwards, an order that does not fit is a
    MemoryLimitError, and the plan reports each stage's peak activation bytes. Its tails are part of every
    simulated iteration (valley sweep, reconfiguration, baseline). Interleaved 1F1B and DualPipeV (a layout with
    several chunks per stage) take only the baseline policy (every unit at the highest clock): EnvPipe's
    envelope is defined for one model stage per pipeline stage.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    reconfig = Reconfig() if reconfig is None else reconfig
    layout, profile, memory = case.layout, case.profile, case.memory
    check_schedule(schedule, layout)
    if layout.chunks > 1 and policy != "baseline":
        raise ValueError(f"EnvPipe's {policy} policy needs one model stage per pipeline stage; plan {schedule} "
                         "with --policy baseline (simulation) or optimal")
    M, S = case.num_microbatches, layout.num_stages
    candidates = candidate_clocks([int(f) for f in profile.freqs], gpu)
    valley = [profile.f_max] * S if policy == "baseline" else valley_clocks(case, candidates, policy == "uniform")

    reschedule = [0] * S
    if schedule == "envpipe" and policy != "baseline":
        bwd_max = [profile.bwd_time[s, 0] for s in range(S)]
        fwd_opt = [profile.fwd_time[s, profile.freq_index(valley[s])] for s in range(S)]
        reschedule = reschedule_counts(bwd_max, fwd_opt, M, None if memory is None else warmup_caps(memory, S))
    orders = build_schedule(schedule, S, M, reschedule, layout.chunks if layout.chunks > 1 else None)
    peak_bytes = None if memory is None else memory.check(orders, schedule, layout.chunks)
    dag = PipelineDag.from_orders(orders, M, layout)
    clock_index = np.zeros(profile.f_max + 1, int)  # MHz -> column of the profile
    clock_index[profile.freqs] = np.arange(profile.freqs.size)

    def simulate_freqs(freqs: np.ndarray, previous: Timeline | None, changed: np.ndarray | None) -> Timeline:
        dur, en = unit_costs(dag, case.model_profile, clock_index[freqs])
        if previous is None or changed is None:
            return simulate(dag, dur, en, case.overheads)
        return resimulate(previous, dur, en, changed)

    start = initial_clocks(policy, dag, profile.f_max, valley)
    how = replace(reconfig, method="default") if policy == "baseline" else reconfig
    result = reconfigure(dag, start, profile.freqs, simulate_freqs, how)
    baseline = baseline_timeline(case)
    name = policy if how.method == "default" else f"{policy}+{how.method}"
    plan = replace(plan_from_timeline(result.timeline, result.freqs_mhz, schedule, name, baseline),
                   peak_memory_bytes=peak_bytes)
    notes = [f"candidate clocks: {candidates[0]}..{candidates[-1]} MHz ({len(candidates)}); "
             f"valley clock per stage: {valley}; extra warm-up forwards r_s: {reschedule}"]
    if result.rounds:
        notes.append(f"reconfiguration: {result.raises} raises in {result.rounds} rounds ({result.stop_reason})")
    return Planned(plan, result.timeline, baseline, reschedule, None, [(reschedule, result.timeline.energy)],
                   reconfig_rounds=result.rounds, notes=tuple(notes))

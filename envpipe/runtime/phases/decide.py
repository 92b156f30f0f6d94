"""Rank 0's choice of what the job runs, and why: a typed `Decision` (no collectives here).

Where the plan comes from, in order: a plan file (`envpipe.plan`); EnvPipe's own rule for its
`baseline` policy (1F1B, or its order from measured unit times, every clock at max); otherwise the
planner on a profile (online, a profile file, or measured default-clock units with the frequency model
where clocks cannot be changed): the optimal planner (least energy within the budget, the unit order
chosen within memory) or EnvPipe's policies. With `straggler: frontier`, the replicas that wait for a
straggler get the least-energy frontier plan that fits its time (`envpipe.runtime.phases.straggler`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import ScheduleError, engine_order_dag
from envpipe.plan.evaluate import baseline_timeline, evaluate_plan
from envpipe.plan.memory import StageMemory, warmup_caps
from envpipe.plan.planfile import Plan, PlanError
from envpipe.plan.reconfig import Reconfig
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b, reschedule_counts
from envpipe.plan.simulate import Overheads, Timeline
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.decision import CalibrationResult, Decision, Job, Origin
from envpipe.runtime.measure.timing import SimInputs, predict_time


def planner_memory(memory: Sequence[S.MemoryUse]) -> StageMemory | None:
    """The planner's memory model from the measured stages; None where a stage has no limit (CPU)."""
    if not memory or any(m.available_bytes is None or m.activation_bytes_per_microbatch <= 0 for m in memory):
        return None
    return StageMemory(tuple(m.activation_bytes_per_microbatch for m in memory),
                       tuple(m.available_bytes or 0 for m in memory))


def usable_memory(memory: Sequence[S.MemoryUse]) -> tuple[StageMemory | None, bool]:
    """(the memory model to plan with, whether only 1F1B may run): where even 1F1B keeps more in flight than
    the model fits, 1F1B runs anyway (calibration ran it) and no extra warm-up forwards are planned."""
    model = planner_memory(memory)
    if model is not None and min(warmup_caps(model, model.num_stages)) < 0:
        return None, True
    return model, False


def memory_refusals(uncapped: Sequence[int], capped: Sequence[int], memory: Sequence[S.MemoryUse],
                    num_microbatches: int) -> list[str]:
    """Why the memory limit cut EnvPipe's extra warm-up forwards (one line per stage it cut; none without a
    measured memory)."""
    if not memory:
        return []
    P = len(memory)
    out = []
    for s, (want, got) in enumerate(zip(uncapped, capped, strict=True)):
        m = memory[s]
        need = min(num_microbatches, P - s + want)  # envpipe_schedule: stage s warms up min(M, P - s + r_s)
        if got < want and m.max_in_flight is not None and need > m.max_in_flight:  # memory cut it, not the rule
            out.append(f"envpipe order with {want} extra warm-up forward(s) on stage {s}: {need} micro-batches "
                       f"in flight x {m.activation_bytes_per_microbatch / 2**20:.1f} MiB exceed the "
                       f"{m.max_in_flight} that fit "
                       f"({(m.limit_bytes or 0) / 2**20:.0f} MiB limit less headroom and "
                       f"{m.static_bytes / 2**20:.0f} MiB static); capped at {got}")
    return out


def over_memory(memory: Sequence[S.MemoryUse], num_microbatches: int) -> list[str]:
    """Stages where even 1F1B keeps more micro-batches in flight than the memory model fits (it runs anyway:
    calibration ran it)."""
    P = len(memory)
    return [f"stage {s}: even 1F1B keeps {min(P - s, num_microbatches)} micro-batches in flight, above the "
            f"{m.max_in_flight} that fit under the memory limit; the order stays 1F1B there"
            for s, m in enumerate(memory) if m.max_in_flight is not None
            and min(P - s, num_microbatches) > m.max_in_flight]


def order_name(reschedule: Sequence[int]) -> str:
    return "1f1b" if not any(reschedule) else f"envpipe (extra warm-up forwards per stage: {list(reschedule)})"


def _predicted(plan_tl: Timeline, base_tl: Timeline, replicas: int, profile: str) -> S.PredictedComparison:
    """The planner's prediction against its baseline."""
    energy, base_e = plan_tl.energy * replicas, base_tl.energy * replicas
    return S.PredictedComparison(plan_tl.iteration_time, energy, base_tl.iteration_time, base_e, 1.0 - energy / base_e,
                                 plan_tl.iteration_time / base_tl.iteration_time - 1.0, profile)


def _with_band(predicted: S.PredictedComparison, plan: Plan, tl: Timeline, one_clock_top: float | None
               ) -> S.PredictedComparison:
    """With ``one_clock_top`` (the profile's lower clocks come from another GPU's curve: clocks could not be
    profiled here) the saving's band from that path's measured cross-GPU error (envpipe.profile.band)."""
    if one_clock_top is None:
        return predicted
    return replace(predicted, saving_band=_saving_band(plan, tl, predicted.energy_saving, one_clock_top))


def _saving_band(plan: Plan, tl: Timeline, saving: float, top_mhz: float) -> list[float] | None:
    """(low, high) of the saving given the one-clock path's measured error for the plan's lowest clock; None when
    the plan goes below the clocks that error was measured for."""
    from envpipe.profile.band import one_clock_band

    freqs = tl.dag.scatter(plan.clocks())
    lowest = float(freqs.min())
    band = one_clock_band(min(lowest, top_mhz), top_mhz)
    if band is None:
        return None
    lowered = float(tl.unit_energy[freqs < top_mhz].sum()) / tl.energy if tl.energy > 0 else 0.0
    return list(band.saving_range(saving, min(1.0, lowered)))


def from_plan_file(path: str, job: Job, cal: SimInputs) -> Decision:
    """A plan file for this pipeline's shape and the engine's order rules; PlanError (one line) otherwise."""
    plan = Plan.load(path)
    if (plan.num_stages, plan.num_microbatches) != (job.stages, job.microbatches):
        raise PlanError(f"{path}: plan is for {plan.num_stages} stages x {plan.num_microbatches} micro-batches, "
                        f"this run has {job.stages} x {job.microbatches}")
    try:
        engine_order_dag(plan.orders(), job.microbatches)
    except ScheduleError as exc:
        raise PlanError(f"{path}: {exc}") from None
    file_digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    p, n = plan.predicted, job.replicas
    predicted = None
    if {"iteration_time_s", "energy_j", "baseline_time_s", "baseline_energy_j"} <= set(p):
        predicted = S.PredictedComparison(
            p["iteration_time_s"], p["energy_j"] * n, p["baseline_time_s"], p["baseline_energy_j"] * n,
            1.0 - p["energy_j"] / p["baseline_energy_j"], p["iteration_time_s"] / p["baseline_time_s"] - 1.0,
            f"the plan file's own prediction (simulated, {path})")
    own = p.get("iteration_time_s")  # the plan file's prediction knows its clocks; the calibrated one assumes max
    return Decision(Origin.PLAN_FILE, f"plan file {path} (sha256 {file_digest})", plan.policy, plan.schedule,
                    {d: plan for d in range(n)}, True, predicted=predicted,
                    predicted_time_s=own if own is not None else predict_time(plan.orders(), cal))


def envpipe_rule(cfg: EnvPipeConfig, job: Job, cal: SimInputs, memory: Sequence[S.MemoryUse]) -> Decision:
    """EnvPipe's `baseline` policy: its order from measured unit times (or 1F1B), every clock at max."""
    P, M = job.stages, job.microbatches
    model, only_1f1b = usable_memory(memory)
    if cfg.scheduling == "1f1b" or only_1f1b:
        orders, r = one_f_one_b(P, M), [0] * P
        refused = over_memory(memory, M)
    else:
        caps = None if model is None else warmup_caps(model, P)
        uncapped = reschedule_counts(cal.bwd_s, cal.fwd_s, M)
        r = reschedule_counts(cal.bwd_s, cal.fwd_s, M, caps)
        refused = memory_refusals(uncapped, r, memory, M)
        orders = envpipe_schedule(P, M, r)
    plan = Plan.at_one_clock(orders, job.f_max, cfg.scheduling, "baseline")
    return Decision(Origin.RULE, "EnvPipe's rule on the calibration's unit times", "baseline", order_name(r),
                    {d: plan for d in range(job.replicas)}, True, memory=tuple(memory), refused_orders=tuple(refused),
                    predicted_time_s=predict_time(orders, cal))


def with_planner(cfg: EnvPipeConfig, job: Job, profile: Profile, calibrated: CalibrationResult) -> Decision:
    """The optimal planner (default) or one of EnvPipe's policies on ``profile``, with the measured overheads
    (transfer, tails, each stage's blocking and tail power) and memory."""
    M, memory = job.microbatches, calibrated.memory
    model, only_1f1b = usable_memory(memory)
    schedule = "1f1b" if only_1f1b else cfg.scheduling
    refused = over_memory(memory, M)
    case = PipelineCase(profile, M, calibrated.overheads(), model)
    if cfg.type == "optimal":
        from envpipe.plan.optimal.orders import optimal_plan
        from envpipe.plan.optimal.problem import candidate_orders

        result = optimal_plan(case, schedule, cfg.time_budget_s, cfg.max_slowdown)
        plan, timeline, base_tl, r = result.plan, result.timeline, result.baseline, result.reschedule
        budget: float | None = result.budget_s
        refused += [f"{order_name(t)}: no plan within the budget" for t, e in result.tried if e is None]
        wanted = candidate_orders(replace(case, memory=None), cfg.scheduling)
        allowed = candidate_orders(case, schedule)
        refused += [f"{order_name(w)}: more in-flight activations than fit in memory" for w in wanted
                    if w not in allowed]
    else:
        from envpipe.plan.planner import make_plan

        online = job.controls and cfg.reconfig_method != "default"  # the run raises clocks itself afterwards

        def planned(memory_model: StageMemory | None, order: str) -> Any:
            return make_plan(replace(case, memory=memory_model), order, cfg.type,
                             Reconfig("default" if online else cfg.reconfig_method), cfg.gpu or "all")

        made = planned(model, schedule)
        plan, timeline, base_tl, r, budget = made.plan, made.timeline, made.baseline, made.reschedule, None
        if model is not None and cfg.scheduling == "envpipe":
            refused += memory_refusals(planned(None, "envpipe").reschedule, r, memory, M)
    top = None if job.controls else float(max(profile.freqs.max(), 1))  # clocks not profiled here: one-clock path
    return Decision(Origin.PLANNER, f"planner ({cfg.type}) on a profile: {profile.source}", plan.policy,
                    order_name(r), {d: plan for d in range(job.replicas)}, job.controls, budget, tuple(memory),
                    tuple(refused),
                    _with_band(_predicted(timeline, base_tl, job.replicas, profile.source), plan, timeline, top),
                    timeline.iteration_time, profile)


def with_straggler_rule(decision: Decision, fast_profile: Profile, straggler: int, overheads: Overheads,
                        schedule: str) -> Decision:
    """The other replicas take the least-energy frontier plan that fits the straggler's predicted time."""
    from envpipe.runtime.phases.straggler import relaxed_plan

    assert decision.predicted_time_s is not None
    case = PipelineCase(fast_profile, decision.plans[0].num_microbatches, overheads)
    found = relaxed_plan(case, schedule, decision.predicted_time_s)
    if found is None:
        rule = S.StragglerRule(straggler, False, "no frontier plan of the other replicas fits the straggler's time",
                               decision.predicted_time_s, None, None)
        return replace(decision, straggler_rule=rule)
    plans = {d: (p if d == straggler else found.plan) for d, p in decision.plans.items()}  # simulated, both
    rule = S.StragglerRule(straggler, True, None, decision.predicted_time_s, found.timeline.iteration_time,
                           found.timeline.energy)
    return replace(decision, plans=plans, straggler_rule=rule)


def replanned(decision: Decision, plan: Plan, order: str, case: PipelineCase, budget_s: float | None) -> Decision:
    """The decision with a re-planned (or raised) plan for every replica, re-predicted on ``case``."""
    tl, base = evaluate_plan(plan, case), baseline_timeline(case)
    replicas = len(decision.plans)
    return replace(decision, plans={d: plan for d in decision.plans}, order=order, budget_s=budget_s,
                   predicted=_predicted(tl, base, replicas, case.profile.source), predicted_time_s=tl.iteration_time,
                   profile=case.profile)


def choose(cfg: EnvPipeConfig, job: Job, calibrated: CalibrationResult, profile: Profile | None) -> Decision:
    """Rank 0's decision: a plan file, EnvPipe's rule, or the planner on ``profile``."""
    if cfg.plan:
        return from_plan_file(cfg.plan, job, calibrated.timing)
    if profile is None:
        return envpipe_rule(cfg, job, calibrated.timing, calibrated.memory)
    if profile.num_stages != job.stages:
        raise ValueError(f"profile {profile.source} has {profile.num_stages} stages, the pipeline {job.stages}")
    chosen = with_planner(cfg, job, profile, calibrated)
    if calibrated.straggler is not None and cfg.straggler == "frontier" and job.replicas > 1:
        chosen = with_straggler_rule(chosen, profile, calibrated.straggler, calibrated.overheads(), cfg.scheduling)
    return chosen

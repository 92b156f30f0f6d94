"""Evaluating plans on a case: unit costs at given clocks, any plan re-simulated (also one written by hand),
the baseline every saving is measured against, and freezing a simulated assignment into a `Plan`."""

from __future__ import annotations

import numpy as np

from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import PipelineDag
from envpipe.plan.layout import StageLayout
from envpipe.plan.planfile import PREDICTED_KEYS, Plan, PlanError, PlannedUnit
from envpipe.plan.schedules import CHUNKED, build_schedule, one_f_one_b, schedule_layout
from envpipe.plan.simulate import Timeline, simulate
from envpipe.profile import Profile

SCHEDULE_NAMES = {"1f1b": "1F1B", "envpipe": "EnvPipe's order", "gpipe": "GPipe", "interleaved": "interleaved 1F1B",
                  "dualpipev": "DualPipeV"}


def unit_costs(dag: PipelineDag, profile: Profile, freq_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit duration and energy for per-unit clock indices into ``profile.freqs`` (``profile``: one row
    per model stage of the DAG)."""
    s = dag.model_stage
    dur = np.where(dag.is_fwd, profile.fwd_time[s, freq_idx], profile.bwd_time[s, freq_idx])
    en = np.where(dag.is_fwd, profile.fwd_energy[s, freq_idx], profile.bwd_energy[s, freq_idx])
    return dur, en


def unit_clocks(plan: Plan, dag: PipelineDag) -> np.ndarray:
    """The plan's clock (MHz) of every unit, indexed like ``dag``'s units."""
    clocks = np.empty(dag.num_units, int)
    for s, units in enumerate(plan.stages):
        for u in units:
            clocks[dag.index(s, u.kind, u.mb, u.chunk)] = u.freq_mhz
    return clocks


def evaluate_plan(plan: Plan, case: PipelineCase) -> Timeline:
    """Re-simulate any plan (also one written by hand) on a case; clear errors if they do not fit. A plan with
    several chunks per stage takes a case whose profile has a row per model stage or per stage (split evenly)."""
    mine, theirs = plan.layout(), case.layout
    if mine.num_stages != theirs.num_stages:
        raise PlanError(f"plan has {plan.num_stages} stages but the case has {theirs.num_stages}")
    if mine != theirs:
        raise PlanError(f"plan's {plan.schedule} runs {mine.chunks} model chunk(s) per stage in another layout than "
                        f"the case's ({theirs.chunks} per stage)")
    dag = plan.dag
    profile = case.profile
    clock_index = {int(f): k for k, f in enumerate(profile.freqs)}
    for s, units in enumerate(plan.stages):
        for u in units:
            if u.freq_mhz not in clock_index:
                raise PlanError(f"stage {s} {u.kind}{u.mb}: {u.freq_mhz} MHz is not a clock of the profile "
                                f"({profile.freqs[-1]}..{profile.freqs[0]} MHz)")
    freq_idx = np.array([clock_index[f] for f in unit_clocks(plan, dag).tolist()], int)
    dur, en = unit_costs(dag, case.model_profile, freq_idx)
    return simulate(dag, dur, en, case.overheads)


def baseline_schedule(layout: StageLayout) -> str:
    """The schedule of the baseline on ``layout``: 1F1B; for several chunks per stage, the schedule that runs that
    layout (the model is cut differently, so 1F1B would not be the same job)."""
    if layout.chunks == 1:
        return "1f1b"
    return next(n for n in CHUNKED if schedule_layout(n, layout.num_stages, layout.chunks) == layout)


def baseline_name(layout: StageLayout) -> str:
    """What a saving is against, in words: ``1F1B all-max``."""
    return f"{SCHEDULE_NAMES[baseline_schedule(layout)]} all-max"


def baseline_timeline(case: PipelineCase) -> Timeline:
    """DESIGN's baseline: 1F1B with every unit at the profile's highest clock; for a layout with several chunks
    per stage, the schedule of that layout at the highest clock (``baseline_schedule``)."""
    layout, M = case.layout, case.num_microbatches
    if layout.chunks == 1:
        dag = PipelineDag.from_orders(one_f_one_b(layout.num_stages, M), M)
    else:
        orders = build_schedule(baseline_schedule(layout), layout.num_stages, M, chunks=layout.chunks)
        dag = PipelineDag.from_orders(orders, M, layout)
    dur, en = unit_costs(dag, case.model_profile, np.zeros(dag.num_units, int))
    return simulate(dag, dur, en, case.overheads)


def plan_from_timeline(timeline: Timeline, freqs_mhz: np.ndarray, schedule: str, policy: str,
                       baseline: Timeline) -> Plan:
    """Freeze a simulated assignment (per-unit clocks in MHz) into a Plan with its predictions."""
    dag = timeline.dag
    stages = [[PlannedUnit(*dag.unit(i)[1:], int(freqs_mhz[i]), int(dag.chunk[i])) for i in ids] for ids in dag.order]
    predicted = {
        "iteration_time_s": timeline.iteration_time,
        "energy_j": timeline.energy,
        "baseline_time_s": baseline.iteration_time,
        "baseline_energy_j": baseline.energy,
    }
    assert set(predicted) == set(PREDICTED_KEYS)
    path = [dag.unit(i) if dag.num_chunks == 1 else (*dag.unit(i), int(dag.chunk[i])) for i in timeline.critical_path()]
    return Plan(dag.num_stages, dag.num_microbatches, schedule, policy, stages, predicted, path, None, dag.num_chunks)

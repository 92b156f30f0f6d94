"""What the run's predictions were worth: the energy model against the counter, and on a simulated GPU the
saving a planner that knew the GPU's hidden truth would have found (rank 0, no collectives here).

Energy model: what the steady phase ran, simulated on the profile the run planned on with the calibrated
transfer and tails, each phase charged at its own power: units at their profiled energy, a stage's waits
at its measured blocking power, its tail (all-reduce, optimizer step) at its measured tail power. The
prediction is one pipeline's; with data parallelism every replica runs it, so a stage's prediction is
times the replicas. Measured: per stage, the median steady energy of each of its GPUs, summed.
Error = (predicted - measured) / measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envpipe.plan.planfile import Plan, baseline_timeline, evaluate_plan
from envpipe.plan.simulate import Timeline
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.calibrate import Calibrated
from envpipe.runtime.collect import RankRecord
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.decide import all_max


def stage_energy(tl: Timeline, blocking_w: Sequence[float], tail_w: Sequence[float]) -> np.ndarray:
    """(S,) joules per stage of one simulated iteration: its units, its waits at its blocking power, its tail
    at its tail power."""
    dag = tl.dag
    units = np.bincount(dag.stage, weights=tl.unit_energy, minlength=dag.num_stages)
    waits = tl.idle_time - tl.tail_s
    return units + waits * np.asarray(blocking_w, float) + tl.tail_s * np.asarray(tail_w, float)


def ran(plan: Plan, order_only: bool, f_max: int) -> Plan:
    """What the steady phase ran: the plan, or its order with every clock left at the top (default) clock."""
    return all_max(plan.orders(), f_max, plan.schedule, plan.policy) if order_only else plan


def energy_prediction(records: Sequence[RankRecord], runs: str, plan: Plan, profile: Profile | None,
                      calibrated: Calibrated, energy: str) -> S.EnergyPrediction | None:
    """The energy model's prediction for ``plan`` (what ran) against every GPU's measured steady energy; None
    without a profile, measured powers, or a measured energy on every GPU."""
    cal = calibrated.timing
    if profile is None or calibrated.blocking_power_w is None or calibrated.tail_power_w is None:
        return None
    measured: dict[int, float] = {}
    for r in records:
        e = r.energy(runs)
        if e is None:
            return None
        measured[r.place.stage] = measured.get(r.place.stage, 0.0) + e
    replicas = len({r.place.replica for r in records})
    tl = evaluate_plan(plan, profile, calibrated.idle_power_w or 0.0, cal.transfer_s, np.asarray(cal.tail_s))
    predicted = replicas * stage_energy(tl, calibrated.blocking_power_w, calibrated.tail_power_w)
    stages = [S.StageEnergy(s, float(p), measured[s], _error(float(p), measured[s])) for s, p in enumerate(predicted)]
    total_p, total_m = float(predicted.sum()), sum(measured.values())
    return S.EnergyPrediction(stages, total_p, total_m, _error(total_p, total_m), energy)


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def oracle_comparison(cfg: EnvPipeConfig, truth: Profile, plan: Plan, calibrated: Calibrated,
                      blocking_w: float, source: str) -> S.OracleComparison:
    """On a simulated GPU: the optimal planner on the GPU's true profile (``truth``: every clock, no noise),
    against the run's own plan evaluated on the same truth; both against the truth's 1F1B all-max baseline,
    at the run's budget rule (simulated, all)."""
    from envpipe.plan.lp import InfeasibleBudget
    from envpipe.plan.optimal import optimal_plan

    cal = calibrated.timing
    tail = np.asarray(cal.tail_s)
    base = baseline_timeline(truth, plan.num_microbatches, blocking_w, cal.transfer_s, tail)
    try:
        best = optimal_plan(truth, plan.num_microbatches, idle_power_w=blocking_w, schedule=cfg.scheduling,
                            time_budget_s=cfg.time_budget_s, max_slowdown=cfg.max_slowdown,
                            transfer_s=cal.transfer_s, tail_s=tail).timeline.energy
    except InfeasibleBudget:
        best = base.energy
    ours = evaluate_plan(_on_clocks_of(plan, truth), truth, blocking_w, cal.transfer_s, tail).energy
    return S.OracleComparison(1.0 - best / base.energy, 1.0 - ours / base.energy, source)


def _on_clocks_of(plan: Plan, profile: Profile) -> Plan:
    """``plan`` with each clock snapped to the nearest clock of ``profile`` (a GPU snaps a request the same way)."""
    freqs = np.asarray(profile.freqs)
    return plan.with_clocks([[int(freqs[np.argmin(np.abs(freqs - c))]) for c in cs] for cs in plan.clocks()])

"""What the run's predictions were worth: the energy model against the counter, and on a simulated GPU the
saving a planner that knew the GPU's hidden truth would have found (rank 0, no collectives here).

Energy model: what the steady phase ran, simulated on the profile the run planned on with the calibrated
transfer and tails, each phase charged at its own power: units at their profiled energy, a stage's waits
at its measured blocking power, its tail (all-reduce, optimizer step) at its measured tail power. The
prediction is one pipeline's; with data parallelism every replica runs it, so a stage's prediction is
times the replicas. It is anchored on the calibration's untimed 1F1B iterations: per stage, the simulated
ratio of what ran to 1F1B all-max, times that stage's measured 1F1B energy (envpipe.runtime.phases.calibrate).
Measured: per stage, the median steady energy of each of its GPUs, summed.
Error = (predicted - measured) / measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from envpipe.plan.case import PipelineCase
from envpipe.plan.evaluate import baseline_timeline, evaluate_plan
from envpipe.plan.planfile import Plan
from envpipe.plan.simulate import Overheads
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.decision import CalibrationResult, Decided
from envpipe.runtime.report.collect import RankRecord


def ran(plan: Plan, order_only: bool, f_max: int) -> Plan:
    """What the steady phase ran: the plan, or its order with every clock left at the top (default) clock."""
    return Plan.at_one_clock(plan.orders(), f_max, plan.schedule, plan.policy) if order_only else plan


def energy_prediction(records: Sequence[RankRecord], runs: str, plan: Plan, decided: Decided, energy: str
                      ) -> S.EnergyPrediction | None:
    """The energy model's prediction for ``plan`` (what ran) on the profile the run planned on, against every
    GPU's measured steady energy; None without a profile, measured powers, or a measured energy on every GPU."""
    profile, calibrated = decided.decision.profile, decided.calibrated
    if profile is None or calibrated.blocking_power_w is None or calibrated.tail_power_w is None:
        return None
    measured: dict[int, float] = {}
    for r in records:
        e = r.energy(runs)
        if e is None:
            return None
        measured[r.place.stage] = measured.get(r.place.stage, 0.0) + e
    replicas = len({r.place.replica for r in records})
    case = PipelineCase(profile, plan.num_microbatches, calibrated.overheads())
    predicted = replicas * evaluate_plan(plan, case).stage_energy
    anchor = calibrated.report.anchor_energy_j
    if anchor is not None:  # each stage's simulated ratio to 1F1B all-max, times its measured 1F1B iterations
        predicted = predicted / (replicas * baseline_timeline(case).stage_energy) * np.asarray(anchor)
    stages = [S.StageEnergy(s, float(p), measured[s], _error(float(p), measured[s])) for s, p in enumerate(predicted)]
    total_p, total_m = float(predicted.sum()), sum(measured.values())
    return S.EnergyPrediction(stages, total_p, total_m, _error(total_p, total_m), energy)


# What a prediction must hold to be trusted: the run's iteration time and energy within 3 %, each stage's energy
# within 5 % (the targets the runtime is measured against: benchmarks/results/dropin_*.md).
TIME_BAND, ENERGY_BAND, STAGE_ENERGY_BAND = 0.03, 0.03, 0.05


def trust(summary: S.RunSummary) -> S.Trust:
    """Whether this run's predictions can be trusted: its calibration settled, and its time and energy were predicted
    within their bands (each reason why not is one line)."""
    reasons = []
    c = summary.calibration
    if c is not None and c.settled is False and c.change is not None:
        reasons.append(f"the calibration's iteration time never settled (its median still moved {100 * c.change:+.1f} %"
                       f" after {c.ran} iterations)")
    elif c is not None and c.settled is None:
        reasons.append(f"{c.iterations} measured calibration iteration(s): too few to tell whether the time settled")
    if summary.time_error is not None and abs(summary.time_error) > TIME_BAND:
        reasons.append(f"iteration time predicted {100 * summary.time_error:+.1f} % off the measured "
                       f"(band +-{100 * TIME_BAND:g} %)")
    e = summary.energy
    if e is not None and abs(e.error) > ENERGY_BAND:
        reasons.append(f"energy predicted {100 * e.error:+.1f} % off the counter (band +-{100 * ENERGY_BAND:g} %)")
    for x in [] if e is None else e.stages:
        if abs(x.error) > STAGE_ENERGY_BAND:
            reasons.append(f"stage {x.stage}'s energy predicted {100 * x.error:+.1f} % off the counter "
                           f"(band +-{100 * STAGE_ENERGY_BAND:g} %)")
    return S.Trust(not reasons, reasons)


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


@dataclass(frozen=True)
class GpuTruth:
    """A simulated GPU's hidden truth, as the oracle plans on it: its profile (every clock, no noise), each
    stage's true blocking and tail power (W), and the truth's name."""

    profile: Profile
    blocking_w: list[float]
    tail_w: list[float]
    source: str


def oracle_comparison(cfg: EnvPipeConfig, truth: GpuTruth, plan: Plan, calibrated: CalibrationResult
                      ) -> S.OracleComparison:
    """On a simulated GPU: the optimal planner on the GPU's truth, against the run's own plan evaluated on the
    same truth; both against the truth's 1F1B all-max baseline, at the run's budget rule (simulated, all)."""
    from envpipe.plan.optimal.lp import InfeasibleBudget
    from envpipe.plan.optimal.orders import optimal_plan

    cal = calibrated.timing
    overheads = Overheads.broadcast(truth.profile.num_stages, truth.blocking_w, cal.transfer_s, cal.tail_s,
                                    truth.tail_w)
    case = PipelineCase(truth.profile, plan.num_microbatches, overheads)
    base = baseline_timeline(case)
    try:
        best = optimal_plan(case, cfg.scheduling, cfg.time_budget_s, cfg.max_slowdown).timeline.energy
    except InfeasibleBudget:
        best = base.energy
    ours = evaluate_plan(_on_clocks_of(plan, truth.profile), case).energy
    return S.OracleComparison(1.0 - best / base.energy, 1.0 - ours / base.energy, truth.source)


def _on_clocks_of(plan: Plan, profile: Profile) -> Plan:
    """``plan`` with each clock snapped to the nearest clock of ``profile`` (a GPU snaps a request the same way)."""
    freqs = np.asarray(profile.freqs)
    return plan.with_clocks([[int(freqs[np.argmin(np.abs(freqs - c))]) for c in cs] for cs in plan.clocks()])

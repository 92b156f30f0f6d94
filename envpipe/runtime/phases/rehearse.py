"""The rehearsal: a plan's timing measured on GPUs whose clocks cannot be set, before any clock daemon exists.

Every unit the plan runs below the top clock is stretched, after its kernels and on its own stream, by the extra
time the profile the plan was made on predicts at its planned clock (on a GPU without the daemon: the frequency
model over the measured default-clock units). Communication, dependencies and bubbles then behave as they would at
those clocks. The rehearsed iterations are interleaved ABBA with this run's 1F1B all-max iterations, like the steady
phase's comparison pairs, after one warm-up iteration of an order this process has not run.

Before it, with the optimal policy's `replan` reconfiguration, the reconfiguration rounds rehearse too
(envpipe.runtime.phases.reconfigure): a plan measured over the budget is re-planned on the units' measured times until
it measures within it, or gives way to 1F1B all-max (then nothing is left to rehearse).

What it tells: the rehearsed plan's measured slowdown beside the planner's predicted one, and per stage the planned
delay beside what its GPU's timer spun. Energy is the planner's prediction only (simulated): a GPU spinning on its
timer draws about its idle power (116 W against 692 W in GEMMs on one H100, 2026-11-28), not what a slowed unit
draws. A rehearsal compares measured iteration times, not sums of delays: a spin leaves the GPU power headroom, so
the unit after it may run faster than it would after a real low clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from envpipe.plan.planfile import Plan
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.clocks import time_label
from envpipe.runtime.decision import Decision
from envpipe.runtime.measure.collective import Place, progress
from envpipe.runtime.measure.iterations import comparison_pattern, job_iterations, paired
from envpipe.runtime.rig import Phase, Rig, Step

REHEARSAL = "rehearsal"  # what a rehearsed iteration runs (the iteration lines' `runs`)
PHASE = "rehearse"


def unit_time(profile: Profile, stage: int, kind: str, mhz: float) -> float:
    """A unit's time at ``mhz`` on ``profile`` (linear between its clocks, flat beyond them)."""
    table = profile.fwd_time if kind == "F" else profile.bwd_time
    freqs = np.asarray(profile.freqs, float)
    order = np.argsort(freqs)
    return float(np.interp(mhz, freqs[order], np.asarray(table[stage], float)[order]))


def stretches(plan: Plan, profile: Profile, stage: int, top_mhz: float) -> list[float]:
    """Per unit of ``stage``'s order, its extra time at its planned clock over the top clock (seconds, >= 0)."""
    out = []
    for u in plan.stages[stage]:
        extra = unit_time(profile, stage, u.kind, u.freq_mhz) - unit_time(profile, stage, u.kind, top_mhz)
        out.append(max(0.0, extra))
    return out


def lowers_clocks(decision: Decision, top_mhz: float) -> bool:
    """Whether any stage of ``decision``'s plans runs a unit below ``top_mhz`` (something to rehearse)."""
    return any(f < top_mhz for plan in decision.plans.values() for clocks in plan.clocks() for f in clocks)


def rehearse(rig: Rig, decision: Decision) -> Phase[S.Rehearsal]:
    """Run the rehearsal's pairs; every rank returns the same `Rehearsal` (a collective at the end)."""
    if decision.profile is None or decision.predicted is None:
        raise ValueError("'rehearse' needs the profile the plan was made on (the planner's, online or a profile file)")
    plan = decision.plan_for(rig.place.replica)
    mine = stretches(plan, decision.profile, rig.place.stage, rig.f_max)
    pairs = max(1, rig.cfg.compare_iterations)
    progress(f"rehearse: the plan's units stretched by their planned clocks' extra time (stage {rig.place.stage}: "
             f"{1e3 * sum(mine):.2f} ms per iteration), {pairs} pairs with 1F1B all-max iterations")
    if not rig.has_run(plan):
        yield Step(plan, PHASE, REHEARSAL, timed=False, stretch=mine)  # a new order's first iteration: warm-up
    measured = []
    for runs in comparison_pattern(2 * pairs, pairs, REHEARSAL):
        m = yield Step(plan if runs == REHEARSAL else rig.baseline, PHASE, runs, timed=False,
                       stretch=mine if runs == REHEARSAL else None)
        t = m.timing
        inserted = None if runs != REHEARSAL else 0.0 if m.stretched is None else m.stretched[1]  # 0: nothing asked
        measured.append((runs, t.step_end - t.step_start, inserted))
    gathered = rig.gather((sum(mine), measured))
    return summarize(gathered, decision.predicted, time_label(rig.clock))


RankIterations = list[tuple[str, float, float | None]]  # one rank's: what ran, its time, the delay it inserted


def summarize(gathered: Sequence[tuple[Place, tuple[float, RankIterations]]], predicted: S.PredictedComparison,
              time: str) -> S.Rehearsal:
    """The rehearsal from every rank's (place, (planned delay per iteration, its iterations)): the job's time per
    iteration is its slowest rank's; per stage, the median of its ranks' planned and inserted delays."""
    job = job_iterations([[(runs, t, None) for runs, t, _ in its] for _, (_, its) in gathered])
    spread = S.Spread.of([r[0] / b[0] - 1.0 for r, b in paired(job, REHEARSAL)])
    if spread is None:
        raise ValueError("a rehearsal needs at least one pair")
    stages: dict[int, tuple[list[float], list[float]]] = {}
    for place, (planned, its) in gathered:
        inserted = [x for runs, _, x in its if runs == REHEARSAL and x is not None]
        acc = stages.setdefault(place.stage, ([], []))
        acc[0].append(planned)
        if inserted:
            acc[1].append(statistics.median(inserted))
    rows = [S.RehearsedStage(s, statistics.median(p), statistics.median(x) if x else None)
            for s, (p, x) in sorted(stages.items())]
    return S.Rehearsal(spread.n, spread, predicted.slowdown, predicted.energy_saving, rows, time)

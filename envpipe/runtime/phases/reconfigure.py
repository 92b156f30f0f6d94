"""The reconfiguration phase, on measured iterations.

`replan_until_within_budget` (the optimal policy): each round runs the plan against 1F1B all-max
iterations, interleaved ABBA so that drift favours neither; if the plan is slower than the budget allows
beyond the round's own noise, rank 0 corrects the profile with the plan's measured unit times, tightens
the planner's (simulated) budget by the measured excess, and re-plans; it stops once the measured
slowdown is within budget. A plan still over budget after the last round gives way to 1F1B all-max.
Where clocks cannot be set and the run rehearses (`rehearse`), the rounds rehearse: each unit below the top
clock is stretched by its planned clock's extra time (envpipe.runtime.phases.rehearse) instead of running at it, a new
order warms up for one iteration first, the pairs run untimed, and the profile is corrected by the round's own
timed 1F1B all-max iterations (their units against the profile's top clock; a stretched unit's marks hold its
delay, and the delay would pass for the next unit's overhead): the calibration's unit times drift from the ones the job
runs later (2 x H200, 2026-11-28: a stage's forwards 5 % faster, its neighbour's 3 % slower), and a plan that
spends a stage's whole predicted slack on lower clocks turns every such millisecond into a slowdown.

`raise_clocks` (EnvPipe's greedy and balanced): each round runs one real iteration, turns the measured
units of all stages into a timeline (`envpipe.runtime.measure.timing.measured_timeline`: each unit's recv stall
is its dependency wait) and hands it to the planner's own loop, `envpipe.plan.reconfig.reconfigure`,
which walks EnvPipe's critical path and raises clocks until the path is the envelope, nothing on it can
be raised, or the round limit is reached. Every rank sees the same gathered measurements.
"""

from __future__ import annotations

import statistics
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from envpipe.plan.case import PipelineCase
from envpipe.plan.planfile import Plan
from envpipe.plan.reconfig import Reconfig, reconfigure_rounds
from envpipe.plan.simulate import Overheads, Timeline
from envpipe.profile import Profile
from envpipe.runtime import summary as S
from envpipe.runtime.decision import CalibrationResult, Decision
from envpipe.runtime.measure import collective, replicas
from envpipe.runtime.measure.iterations import BASELINE, PLAN, comparison_pattern, paired
from envpipe.runtime.measure.timing import StageTiming, measured_timeline
from envpipe.runtime.phases import decide, noharm
from envpipe.runtime.phases.rehearse import stretches
from envpipe.runtime.phases.steady import WARMUP
from envpipe.runtime.rig import Phase, Rig, Step

ROUND_PAIRS = 2  # plan/baseline pairs per round
PHASE = "reconfigure"
TIMED = "timed 1F1B"  # a rehearsed round's own 1F1B all-max iterations with their units timed (not paired)


@dataclass(frozen=True)
class RoundIteration:
    """One iteration of a reconfiguration round, as one rank ran it."""

    runs: str  # PLAN, BASELINE or TIMED
    time_s: float
    timing: StageTiming


@dataclass(frozen=True)
class RoundResult:
    """A round's iterations in the order they ran, each as every rank ran it; ``rehearsed``: the plan's clocks
    stood in for by stretches."""

    iterations: list[list[tuple[collective.Place, RoundIteration]]]
    rehearsed: bool

    def runs(self) -> list[str]:
        """What each iteration ran."""
        return [its[0][1].runs for its in self.iterations]

    def job_times(self, runs: str) -> list[float]:
        """The job's time (its slowest rank's) of each iteration that ran ``runs``."""
        return [max(x.time_s for _, x in its) for its in self.iterations if its[0][1].runs == runs]

    def timings(self, runs: str) -> list[list[tuple[collective.Place, StageTiming]]]:
        """Every rank's unit timing of each iteration that ran ``runs``."""
        return [[(w, x.timing) for w, x in its] for its in self.iterations if its[0][1].runs == runs]


def _round(rig: Rig, plan: Plan, rnd: int, stretch: list[float] | None) -> Phase[RoundResult]:
    """Run one round's pairs; every rank gets every rank's iterations of the round. With
    ``stretch`` (this rank's delay per unit: a rehearsal) the plan's units are stretched instead of slowed, a new
    order first warms up, the pairs run untimed as the job will (unit timing made the transformers' rehearsed
    rounds measure 1 to 2.5 points faster than their untimed rehearsal on 2 x H200, 2026-11-28), and the round
    ends with ROUND_PAIRS timed 1F1B all-max iterations, whose units correct the profile (`TIMED`)."""
    mine: list[RoundIteration] = []
    extra = {"round": rnd} if stretch is None else {"round": rnd, "rehearsed": True}
    if stretch is not None and not rig.has_run(plan):
        yield Step(plan, WARMUP, PLAN, timed=False, stretch=stretch, extra=extra)  # not compared
    runs_of = comparison_pattern(2 * ROUND_PAIRS, ROUND_PAIRS) + ([] if stretch is None else [TIMED] * ROUND_PAIRS)
    for runs in runs_of:
        m = yield Step(plan if runs == PLAN else rig.baseline, PHASE, BASELINE if runs == TIMED else runs,
                       timed=stretch is None or runs == TIMED, extra=extra, stretch=stretch if runs == PLAN else None)
        t = m.timing
        mine.append(RoundIteration(runs, t.step_end - t.step_start, t))
    return RoundResult(rig.gather_each(mine), stretch is not None)


def measured_slowdown(result: RoundResult) -> tuple[float, float]:
    """(median plan/baseline time - 1 over the pairs, half their interquartile range): the job's times."""
    job = [(its[0][1].runs, max(x.time_s for _, x in its), None) for its in result.iterations]
    slowdowns = [p[0] / b[0] - 1.0 for p, b in paired(job)]
    return statistics.median(slowdowns), noharm.half_iqr(slowdowns)


def corrected_profile(profile: Profile, plan: Any, timings: list[list[tuple[collective.Place, StageTiming]]],
                      ) -> Profile:
    """``profile`` with each stage's forward and backward times (and energies) scaled by measured / predicted
    for the units the plan ran (its clocks), per stage from its slowest replica."""
    cals = replicas.calibrate_replicas(plan.orders(), timings)
    entries = replicas.stage_entries(cals, timings[-1])
    measured = replicas.slowest_per_stage(entries, profile.num_stages)
    tables = (profile.fwd_time, profile.bwd_time, profile.fwd_energy, profile.bwd_energy)
    f_t, b_t, f_j, b_j = (x.copy() for x in tables)
    for s, units in enumerate(plan.stages):
        ran = measured[s].units
        for kind, t, j, took in (("F", f_t, f_j, ran.fwd_s), ("B", b_t, b_j, ran.bwd_s)):
            predicted = statistics.fmean(t[s, profile.freq_index(u.freq_mhz)] for u in units if u.kind == kind)
            scale = took / predicted
            t[s] *= scale
            j[s] *= scale
    return Profile(profile.freqs, f_t, b_t, f_j, b_j, source=f"{profile.source}, corrected by the units that ran")


def replan_until_within_budget(rig: Rig, chosen: Decision, calibrated: CalibrationResult, rehearsed: bool = False
                               ) -> Phase[tuple[Decision, S.Reconfiguration]]:
    """Re-plan until the plan measures within budget (``rehearsed``: its clocks stood in for by stretches)."""
    cfg, overheads = rig.cfg, calibrated.overheads()
    allowed = cfg.max_slowdown or 0.0
    rounds: list[S.ReconfigRound] = []
    reason = f"round limit ({cfg.reconfigure_rounds}): still over budget; fell back to 1F1B all-max"
    for rnd in range(cfg.reconfigure_rounds):
        plan = chosen.plan_for(rig.place.replica)
        stretch = None
        if rehearsed:
            assert chosen.profile is not None
            stretch = stretches(plan, chosen.profile, rig.place.stage, rig.f_max)
        result = yield from _round(rig, plan, rnd, stretch)
        slowdown, noise = measured_slowdown(result)
        plan_times = result.job_times(PLAN)
        rounds.append(S.ReconfigRound(rnd, statistics.median(plan_times), plan.clocks(), slowdown))
        over = (statistics.median(plan_times) / cfg.time_budget_s - 1.0 if cfg.time_budget_s is not None
                else slowdown - allowed)
        runner_note = f"slowdown {100 * slowdown:+.1f}% against 1F1B all-max (noise {100 * noise:.1f}%)"
        if over <= noharm.allowance(noise):  # the steady phase's no-harm rule allows the same
            reason = f"within budget: {runner_note}"
            break
        chosen = collective.decided(partial(_replan, rig, chosen, overheads, result, over))
        what = "rehearsed " if rehearsed else ""
        collective.progress(f"reconfigure: {what}{runner_note} over the budget; re-planned ({chosen.order})")
    else:
        profile = chosen.profile
        assert profile is not None
        chosen = decide.replanned(chosen, rig.baseline, "1f1b", PipelineCase(profile, rig.M, overheads),
                                  chosen.budget_s)
    target = cfg.time_budget_s
    return chosen, S.Reconfiguration("replan", rounds, target, reason, None, rehearsed)


def _replan(rig: Rig, chosen: Decision, overheads: Overheads, measured: RoundResult, over: float) -> Decision:
    """Rank 0: re-plan on the corrected profile with the budget tightened by the measured excess (and not above
    the corrected profile's 1F1B all-max time within the allowed slowdown); a budget tighter than the fastest
    plan becomes the fastest plan's time: the least energy at the fastest iteration still slows down units off
    the critical path (only 1F1B all-max would give that up). A rehearsal corrects the profile by the round's
    timed 1F1B all-max iterations (its plan's units ran at the top clock, stretched, untimed)."""
    from envpipe.plan.evaluate import baseline_timeline
    from envpipe.plan.optimal.lp import InfeasibleBudget
    from envpipe.plan.optimal.orders import optimal_plan
    from envpipe.plan.optimal.problem import order_problems

    assert chosen.profile is not None and chosen.budget_s is not None
    plan, ran = (rig.baseline, TIMED) if measured.rehearsed else (chosen.plan_for(rig.place.replica), PLAN)
    profile = corrected_profile(chosen.profile, plan, measured.timings(ran))
    model, only_1f1b = decide.usable_memory(chosen.memory)
    schedule = "1f1b" if only_1f1b else rig.cfg.scheduling
    case = PipelineCase(profile, rig.M, overheads, model)
    budget = chosen.budget_s / (1.0 + over)
    if rig.cfg.time_budget_s is None:  # and never above the corrected profile's own 1F1B all-max within budget
        budget = min(budget, baseline_timeline(case).iteration_time * (1.0 + (rig.cfg.max_slowdown or 0.0)))
    _, problems = order_problems(case, schedule)
    budget = max(budget, min(problem.fastest_time() for _, problem in problems))
    try:
        result = optimal_plan(case, schedule, budget)
    except InfeasibleBudget:  # no order fits the memory: nothing to save
        return decide.replanned(chosen, rig.baseline, "1f1b", replace(case, memory=None), budget)
    return decide.replanned(chosen, result.plan, decide.order_name(result.reschedule), replace(case, memory=None),
                            budget)


def raise_clocks(plan: Plan, supported_mhz: Sequence[int], method: str, max_rounds: int
                 ) -> Generator[Plan, Timeline, tuple[Plan, S.Reconfiguration]]:
    """EnvPipe's reconfiguration (greedy, balanced) from measured waits: yields the plan of each round to run
    and is sent back that iteration measured as a Timeline; returns the plan with its clocks raised."""
    if max_rounds < 1:
        raise ValueError("the reconfiguration round limit must be at least 1")
    dag = plan.dag
    top = max(max(c) for c in plan.clocks())
    candidates = np.asarray(sorted({int(f) for f in supported_mhz if f <= top} | {top}))
    rounds: list[S.ReconfigRound] = []
    walk = reconfigure_rounds(dag, dag.scatter(plan.clocks()), candidates, Reconfig(method, max_rounds=max_rounds))
    freqs, _, _ = next(walk)
    while True:
        clocks = dag.per_stage(freqs)
        tl = yield plan.with_clocks(clocks)
        rounds.append(S.ReconfigRound(len(rounds), float(tl.stage_end.max()), clocks))
        try:
            freqs, _, _ = walk.send(tl)
        except StopIteration as done:
            result = done.value
            break
    raised = plan.with_clocks(dag.per_stage(result.freqs_mhz))
    return raised, S.Reconfiguration(method, rounds, None, result.stop_reason, result.raises)


def raise_measured(rig: Rig, chosen: Decision, calibrated: CalibrationResult, method: str
                   ) -> Phase[tuple[Decision, S.Reconfiguration]]:
    """`raise_clocks` on the job's measured iterations (the waits of the replica that ended last)."""
    plan = chosen.plan_for(rig.place.replica)
    assert rig.clock is not None
    walk = raise_clocks(plan, rig.clock.supported_mhz, method, rig.cfg.reconfigure_rounds)
    now, rnd = next(walk), 0
    while True:
        m = yield Step(now, "reconfigure", PLAN, extra={"round": rnd})
        rnd += 1
        gathered = rig.gather(m.timing)  # every replica waits for the one that ended last
        slowest = replicas.slowest_replica(gathered)
        tl = measured_timeline(plan.orders(), [t for w, t in gathered if w.replica == slowest], calibrated.timing)
        try:
            now = walk.send(tl)
        except StopIteration as done:
            raised, record = done.value
            break
    chosen = replace(chosen, plans={d: raised for d in chosen.plans})
    if rig.place.rank == 0 and chosen.profile is not None:  # re-predict the raised plan on the profile
        case = PipelineCase(_with_clocks_of(chosen.profile, raised), rig.M, calibrated.overheads())
        chosen = decide.replanned(chosen, raised, chosen.order, case, None)
    return chosen, record


def _with_clocks_of(profile: Profile, plan: Plan) -> Profile:
    """``profile`` interpolated at every clock the raised plan uses (raises may land between profiled clocks)."""
    from envpipe.profile.interpolate import with_clocks

    return with_clocks(profile, {f for cs in plan.clocks() for f in cs})

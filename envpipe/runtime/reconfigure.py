"""The reconfiguration phase, on measured iterations.

`replan_until_within_budget` (the optimal policy): each round runs the plan against 1F1B all-max
iterations, interleaved ABBA so that drift favours neither; if the plan is slower than the budget allows
beyond the round's own noise, rank 0 corrects the profile with the plan's measured unit times, tightens
the planner's (simulated) budget by the measured excess, and re-plans; it stops once the measured
slowdown is within budget. A plan still over budget after the last round gives way to 1F1B all-max.

`raise_clocks` (EnvPipe's greedy and balanced): each round runs one real iteration, turns the measured
units of all stages into a timeline (`envpipe.runtime.timing.measured_timeline`: each unit's recv stall
is its dependency wait) and hands it to the planner's own loop, `envpipe.plan.reconfig.reconfigure`,
which walks EnvPipe's critical path and raises clocks until the path is the envelope, nothing on it can
be raised, or the round limit is reached. Every rank sees the same gathered measurements.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from envpipe.plan.case import PipelineCase
from envpipe.plan.planfile import Plan
from envpipe.plan.reconfig import Reconfig, reconfigure
from envpipe.plan.simulate import Overheads, Timeline
from envpipe.profile import Profile
from envpipe.runtime import collective, decide, replicas
from envpipe.runtime import summary as S
from envpipe.runtime.iterations import PLAN, comparison_pattern, paired
from envpipe.runtime.timing import Calibration, StageTiming, measured_timeline

if TYPE_CHECKING:
    from envpipe.runtime.runner import Runner

ROUND_PAIRS = 2  # plan/baseline pairs per round
TOLERANCE = 0.005  # a slowdown this far over budget counts as noise even when the round's pairs agree closely


def _round(runner: Runner, data: Iterator[Any], plan: Any, rnd: int) -> list[list[tuple[collective.Place, Any]]]:
    """Run one round's pairs; every rank gets every rank's (what ran, time, timing) of each iteration."""
    mine = []
    for runs in comparison_pattern(2 * ROUND_PAIRS, ROUND_PAIRS):
        t = runner.run(data, plan if runs == PLAN else runner.baseline, "reconfigure", runs, extra={"round": rnd})
        mine.append((runs, t.step_end - t.step_start, t))
    gathered = runner.gather(mine)
    return [[(w, its[i]) for w, its in gathered] for i in range(len(mine))]


def measured_slowdown(iterations: list[list[tuple[collective.Place, Any]]]) -> tuple[float, float]:
    """(median plan/baseline time - 1 over the pairs, half their interquartile range): the job's times."""
    job = [(its[0][1][0], max(x[1] for _, x in its), None) for its in iterations]
    ratios = [p[0] / b[0] for p, b in paired(job)]
    spread = S.Spread.of(ratios)
    assert spread is not None
    return spread.median - 1.0, (spread.q3 - spread.q1) / 2


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
        for kind, t, j in (("F", f_t, f_j), ("B", b_t, b_j)):
            predicted = statistics.fmean(t[s, profile.freq_index(u.freq_mhz)] for u in units if u.kind == kind)
            scale = measured[s][kind] / predicted
            t[s] *= scale
            j[s] *= scale
    return Profile(profile.freqs, f_t, b_t, f_j, b_j, source=f"{profile.source}, corrected by measured units")


def replan_until_within_budget(runner: Runner, data: Iterator[Any], chosen: decide.Decision, cal: Calibration
                               ) -> tuple[decide.Decision, S.Reconfiguration]:
    cfg = runner.cfg
    allowed = cfg.max_slowdown or 0.0
    rounds: list[S.ReconfigRound] = []
    reason = f"round limit ({cfg.reconfigure_rounds}): still over budget; fell back to 1F1B all-max"
    for rnd in range(cfg.reconfigure_rounds):
        plan = chosen.plan_for(runner.place.replica)
        iterations = _round(runner, data, plan, rnd)
        slowdown, noise = measured_slowdown(iterations)
        plan_times = [max(x[1] for _, x in its) for its in iterations if its[0][1][0] == PLAN]
        rounds.append(S.ReconfigRound(rnd, statistics.median(plan_times), plan.clocks()))
        over = (statistics.median(plan_times) / cfg.time_budget_s - 1.0 if cfg.time_budget_s is not None
                else slowdown - allowed)
        runner_note = f"measured slowdown {100 * slowdown:+.1f}% (noise {100 * noise:.1f}%)"
        if over <= max(TOLERANCE, noise):
            reason = f"within budget: {runner_note}"
            break
        choice: Any = None
        if runner.place.rank == 0:
            try:
                choice = _replan(runner, chosen, cal, iterations, plan, over)
            except Exception as exc:
                choice = collective.portable(exc)
        chosen = collective.agree(choice)
        collective.progress(f"reconfigure: {runner_note} over the budget; re-planned ({chosen.info.order})")
    else:
        idle = runner.idle_power_w or 0.0
        profile = chosen.profile
        assert profile is not None
        chosen = decide.replanned(chosen, runner.baseline, "1f1b", profile, cal, idle, runner.dp, chosen.info.budget_s)
    target = cfg.time_budget_s
    return chosen, S.Reconfiguration("replan", rounds, target, reason, None)


def _replan(runner: Runner, chosen: decide.Decision, cal: Calibration, iterations: list[list[Any]], plan: Any,
            over: float) -> decide.Decision:
    """Rank 0: re-plan on the corrected profile with the budget tightened by the measured excess."""
    from envpipe.plan.lp import InfeasibleBudget
    from envpipe.plan.optimal import optimal_plan

    assert chosen.profile is not None and chosen.info.budget_s is not None
    timings = [[(w, x[2]) for w, x in its] for its in iterations if its[0][1][0] == PLAN]
    profile = corrected_profile(chosen.profile, plan, timings)
    budget = chosen.info.budget_s / (1.0 + over)
    idle = runner.idle_power_w or 0.0
    model, only_1f1b = decide.usable_memory(chosen.info.memory)
    try:
        case = PipelineCase(profile, runner.M, Overheads.broadcast(profile.num_stages, idle, cal.transfer_s,
                                                                   cal.tail_s), model)
        result = optimal_plan(case, "1f1b" if only_1f1b else runner.cfg.scheduling, budget)
    except InfeasibleBudget:  # faster than the fastest plan: nothing to save within this budget
        return decide.replanned(chosen, runner.baseline, "1f1b", profile, cal, idle, runner.dp, budget)
    return decide.replanned(chosen, result.plan, decide.order_name(result.reschedule), profile, cal, idle,
                            runner.dp, budget)


def raise_clocks(plan: Plan, supported_mhz: Sequence[int], method: str, max_rounds: int,
                 run_iteration: Callable[[Plan, int], Timeline]) -> tuple[Plan, S.Reconfiguration]:
    """EnvPipe's reconfiguration (greedy, balanced) from measured waits: the plan with its clocks raised.

    ``run_iteration(plan, round)`` runs one iteration of ``plan`` and returns it measured as a Timeline.
    """
    if max_rounds < 1:
        raise ValueError("the reconfiguration round limit must be at least 1")
    dag = plan.dag
    top = max(max(c) for c in plan.clocks())
    candidates = np.asarray(sorted({int(f) for f in supported_mhz if f <= top} | {top}))
    rounds: list[S.ReconfigRound] = []

    def measure(freqs: np.ndarray, _previous: Timeline | None, _changed: np.ndarray | None) -> Timeline:
        clocks = dag.per_stage(freqs)
        tl = run_iteration(plan.with_clocks(clocks), len(rounds))
        rounds.append(S.ReconfigRound(len(rounds), float(tl.stage_end.max()), clocks))
        return tl

    result = reconfigure(dag, dag.scatter(plan.clocks()), candidates, measure, Reconfig(method, max_rounds=max_rounds))
    raised = plan.with_clocks(dag.per_stage(result.freqs_mhz))
    return raised, S.Reconfiguration(method, rounds, None, result.stop_reason, result.raises)


def raise_measured(runner: Runner, data: Iterator[Any], chosen: decide.Decision, cal: Calibration, method: str
                   ) -> tuple[decide.Decision, S.Reconfiguration]:
    """`raise_clocks` on the job's measured iterations (the waits of the replica that ended last)."""
    idle = runner.idle_power_w or 0.0
    plan = chosen.plan_for(runner.place.replica)

    def run_iteration(now: Plan, rnd: int) -> Timeline:
        timing = runner.run(data, now, "reconfigure", PLAN, extra={"round": rnd})
        gathered = runner.gather(timing)  # every replica waits for the one that ended last
        slowest = replicas.slowest_replica(gathered)
        return measured_timeline(plan.orders(), [t for w, t in gathered if w.replica == slowest], cal,
                                 idle_power_w=idle)

    assert runner.clock is not None
    raised, record = raise_clocks(plan, runner.clock.supported_mhz, method, runner.cfg.reconfigure_rounds,
                                  run_iteration)
    chosen = replace(chosen, plans={d: raised for d in chosen.plans})
    if runner.place.rank == 0 and chosen.profile is not None:  # re-predict the raised plan on the profile
        chosen = decide.replanned(chosen, raised, chosen.info.order, _with_clocks_of(chosen.profile, raised), cal,
                                  idle, runner.dp, None)
    return chosen, record


def _with_clocks_of(profile: Profile, plan: Plan) -> Profile:
    """``profile`` interpolated at every clock the raised plan uses (raises may land between profiled clocks)."""
    from envpipe.profile.interpolate import with_clocks

    return with_clocks(profile, {f for cs in plan.clocks() for f in cs})

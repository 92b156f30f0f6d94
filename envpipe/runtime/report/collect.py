"""Rank 0 puts every rank's record together into the run's `RunSummary` (no collectives here).

The job's iteration is its slowest rank's; its energy is the sum over every GPU of every replica.
Measured comparisons pair each plan iteration with the 1F1B all-max iteration next to it (the steady
phase interleaves them ABBA); the planner's prediction is compared only with its own baseline.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime import summary as S
from envpipe.runtime.clocks import Clock, energy_label, time_label
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.decision import Decided
from envpipe.runtime.measure.collective import Place
from envpipe.runtime.measure.iterations import BASELINE, PLAN, job_iterations, paired
from envpipe.runtime.measure.replicas import find_straggler
from envpipe.runtime.measure.timing import predict_time


@dataclass
class RankRecord:
    """What one rank sends rank 0 at the end."""

    place: Place
    steady: list[tuple[str, float, float | None]]  # per steady iteration: what ran, time, this GPU's energy
    peak_memory_bytes: int | None
    unit_energy: S.UnitEnergy | None
    units: list[S.MeasuredUnit]  # the last timed iteration
    plan_digest: str
    allreduce_s: list[float]  # steady timed plan iterations: ReduceTiedGrads + ReduceGrads (engine marks)
    tail_s: list[float]  # step end - last unit end, as calibration measures it
    refusals: list[S.Refusal]
    lost_control: tuple[float, int] | None = None  # clockd: (seconds without control, re-attaches)

    def energy(self, runs: str) -> float | None:
        """This GPU's median energy over the steady iterations that ran ``runs``; None if any lacks it."""
        es = [e for r, _, e in self.steady if r == runs]
        return None if not es or None in es else statistics.median(e for e in es if e is not None)

    def times(self, runs: str) -> list[float]:
        return [t for r, t, _ in self.steady if r == runs]


def iterations(job: Sequence[tuple[str, float, float | None]], runs: str, samples: int) -> S.Iterations | None:
    mine = [(t, e) for r, t, e in job if r == runs]
    if not mine:
        return None
    time_s = S.Spread.of([t for t, _ in mine])
    assert time_s is not None
    energies = [e for _, e in mine]
    energy = None if None in energies else S.Spread.of([e for e in energies if e is not None])
    return S.Iterations(time_s, energy, samples / time_s.median)


def measured_comparison(job: Sequence[tuple[str, float, float | None]], energy: str) -> S.MeasuredComparison | None:
    pairs = paired(job)
    if not pairs:
        return None
    slowdown = S.Spread.of([p[0] / b[0] - 1.0 for p, b in pairs])
    assert slowdown is not None
    with_energy = [(p[1], b[1]) for p, b in pairs if p[1] is not None and b[1] is not None]
    saving = S.Spread.of([1.0 - ep / eb for ep, eb in with_energy]) if len(with_energy) == len(pairs) else None
    return S.MeasuredComparison(len(pairs), saving, slowdown, energy)


def anchored_time(decided: Decided, plan_ran: bool, order_ran: bool, stages: int, microbatches: int) -> float:
    """The predicted iteration of what the steady phase runs: the simulator's time for it over its time for 1F1B
    all-max, times the calibration's untimed 1F1B iterations (the anchor; the simulator's own time where the run
    measured none). The planner's model for a plan whose clocks ran, the calibrated simulator for an order."""
    chosen, cal, report = decided.decision, decided.calibrated.timing, decided.calibrated.report
    base = predict_time(one_f_one_b(stages, microbatches), cal)
    if plan_ran and chosen.predicted_time_s is not None:
        if chosen.predicted is None:  # a plan file's own prediction, with no baseline of its own to scale by
            return chosen.predicted_time_s
        ratio = chosen.predicted_time_s / chosen.predicted.baseline_time_s
    else:
        ratio = (predict_time(chosen.plans[0].orders(), cal) if order_ran else base) / base
    return ratio * (report.anchor_time_s if report.anchor_time_s is not None else base)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _total(xs: Sequence[float | None]) -> float | None:
    return None if None in xs else sum(x for x in xs if x is not None)


def job_summary(records: Sequence[RankRecord], threshold: float, decided: Decided | None, runs: str = PLAN
                ) -> S.JobSummary:
    """Per node, per replica, per stage tails, the straggler flag, and whether the replicas' plans agree,
    over the steady iterations that ran ``runs`` (the plan, or where none was deployed the baseline).

    The replica calibration found straggling stays flagged when steady times no longer show it, which is what
    happens when the other replicas take the straggler rule's slower, cheaper plan.
    """
    detected = None if decided is None else decided.calibrated.straggler
    rule = None if decided is None else decided.decision.straggler_rule
    cal = None if decided is None else decided.calibrated.timing
    sim_tails = [] if cal is None else [max(0.0, t - cal.head_s) for t in cal.tail_s]
    hosts = sorted({(r.place.node_first_rank, r.place.host) for r in records})
    nodes = [S.NodeSummary(i, host, sorted(r.place.rank for r in records if (r.place.node_first_rank, r.place.host)
                                           == (first, host)),
                           _total([r.energy(runs) for r in records if (r.place.node_first_rank, r.place.host) ==
                                   (first, host)]))
             for i, (first, host) in enumerate(hosts)]
    replicas = []
    for d in sorted({r.place.replica for r in records}):
        mine = [r for r in records if r.place.replica == d]
        times = [max(xs) for xs in zip(*(r.times(runs) for r in mine), strict=True)]
        replicas.append((d, _median(times), _total([r.energy(runs) for r in mine])))
    seen = find_straggler({d: t for d, t, _ in replicas if t is not None}, threshold)
    straggler = seen if seen is not None else detected
    where = "steady iterations" if seen is not None else "calibration/profiling" if straggler is not None else None
    tails = []
    for s in sorted({r.place.stage for r in records}):
        mine = [r for r in records if r.place.stage == s]
        tails.append(S.StageTail(s, [_median(r.allreduce_s) for r in mine], [_median(r.tail_s) for r in mine],
                                 sim_tails[s] if s < len(sim_tails) else None))
    digests = {s: {r.plan_digest for r in records if r.place.stage == s} for s in {r.place.stage for r in records}}
    return S.JobSummary(
        len(replicas), len(records), nodes,
        [S.ReplicaSummary(d, _median([t for r in records if r.place.replica == d for t in r.times(runs)]), t, e,
                          d == straggler) for d, t, e in replicas],
        straggler, where, threshold, rule, tails, all(len(x) == 1 for x in digests.values()),
        [r.plan_digest for r in sorted(records, key=lambda r: r.place.rank)])


@dataclass(frozen=True)
class Reported:
    """The steady iterations a summary reports."""

    engine: str  # envpipe, or stock DeepSpeed's name
    runs: str  # what the steady phase ran: PLAN (its clocks where they can be set) or BASELINE (1F1B, default clocks)
    samples: int  # per iteration
    microbatches: int
    wall_times: Sequence[float]  # when rank 0's steady iterations ended (host wall clock)


def assemble(records: Sequence[RankRecord], cfg: EnvPipeConfig, clock: Clock | None, decided: Decided | None,
             reported: Reported) -> S.RunSummary:
    """The summary of a run; for stock DeepSpeed there is nothing decided and no calibration."""
    samples, microbatches, steady_main = reported.samples, reported.microbatches, reported.runs
    chosen = None if decided is None else decided.decision
    cal = None if decided is None else decided.calibrated.timing
    records = sorted(records, key=lambda r: (r.place.replica, r.place.stage))
    stages = len({r.place.stage for r in records})
    label = energy_label(clock)
    job = job_iterations([r.steady for r in records])
    controls = clock is not None and clock.controls_clocks
    order_ran = chosen is not None and steady_main == PLAN
    steady = iterations(job, steady_main, samples)
    assert steady is not None
    predicted_s = None
    if chosen is not None and cal is not None and decided is not None:
        predicted_s = anchored_time(decided, order_ran and controls, order_ran, stages, microbatches)
    info = None if chosen is None else replace(chosen.info, deployed=order_ran and controls, order_deployed=order_ran)
    lost = [r.lost_control for r in records if r.lost_control is not None]
    clock_info = S.ClockInfo(
        "none" if clock is None else clock.kind, controls, label, time_label(clock),
        None if clock is None else clock.note, [x for r in records for x in r.refusals],
        sum(s for s, _ in lost) if lost else None, sum(n for _, n in lost) if lost else None)
    measured = steady.time_s.median
    wall = None
    wall_times = reported.wall_times
    if len(wall_times) > 1 and wall_times[-1] > wall_times[0]:
        wall = samples * (len(wall_times) - 1) / (wall_times[-1] - wall_times[0])
    replicas = len({r.place.replica for r in records})
    return S.RunSummary(
        S.SCHEMA_VERSION, reported.engine, stages, microbatches, replicas, samples, clock_info, info, steady,
        iterations(job, BASELINE, samples) if order_ran else None, measured_comparison(job, label),
        chosen.predicted if chosen is not None else None, predicted_s,
        (predicted_s - measured) / measured if predicted_s else None,
        None if decided is None else decided.calibrated.report, None if decided is None else decided.reconfiguration,
        [S.GpuSummary(r.place.rank, r.place.replica, r.place.stage, r.place.host, r.energy(steady_main),
                      r.peak_memory_bytes, r.unit_energy) for r in records],
        job_summary(records, cfg.straggler_threshold, decided, steady_main),
        [r.units for r in records if r.place.replica == 0], wall_throughput_samples_per_s=wall)

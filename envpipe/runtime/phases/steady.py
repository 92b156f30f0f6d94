"""The steady phase: the decided plan, for as long as the user's loop calls `train_batch()`.

Its first `compare_iterations` pairs interleave the plan with 1F1B all-max iterations in ABBA order (drift
within a pair favours neither side), so the report compares measured with measured. Where clocks can be
changed the plan runs as planned; where they cannot (a GPU without the clock daemon) its *order* still runs,
at default clocks, so the order's time and memory are measured (and the pairs are skipped when that order is
1F1B itself: nothing to compare). Units are timed every `TIMED_EVERY` iterations (every one on a simulated
GPU, whose clock needs every unit).

Before the pairs, an order this process has not run yet (EnvPipe's, on a GPU without the clock daemon) runs
one warm-up iteration (phase `warm-up`, in no comparison and no steady figure): its first iteration pays for new
p2p patterns and allocator growth, 3.5 times a steady one on 2 x H100 (measured 2026-11-27), which would
decide a pair.

At the end of the pairs, first, do no harm (envpipe.runtime.phases.noharm): what ran stays only if it measured within
the budget and no dearer than the 1F1B iterations beside it; otherwise the job runs 1F1B with every clock at max
from then on, and says why.

The report is written at the end of the comparison pairs and again every `summary_interval` iterations
(a collective call: every rank counts the same iterations).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from envpipe.plan.planfile import Plan
from envpipe.runtime import summary as S
from envpipe.runtime.decision import Decision, plan_digest
from envpipe.runtime.measure.collective import progress
from envpipe.runtime.measure.iterations import BASELINE, PLAN, Iteration, comparison_pattern
from envpipe.runtime.measure.timing import StageTiming
from envpipe.runtime.rig import Phase, Rig, Step

# Steady iterations time their units (CUDA events and a synchronize before the loss broadcast) only every this
# many iterations; every iteration still reports its time and energy. Why: on 2 x H200 the runtime timing every
# iteration ran about 4 ms per iteration (1-2.5%) slower than the same engine untimed (measured 2026-11-23).
TIMED_EVERY = 10
STEADY, WARMUP = "steady", "warm-up"  # the phases here: the plan's iterations, a new order's first one
KEPT = 50  # steady iterations of the plan whose units and tails the summary keeps (bounded memory on long runs)


@dataclass
class SteadyRecord:
    """What this rank's steady phase has measured so far, for the summary (bounded)."""

    runs: Plan  # what the steady phase runs (the plan, or its order at default clocks)
    main: str  # PLAN, or BASELINE where nothing but 1F1B at default clocks runs
    pairs: int  # comparison pairs planned
    compared: list[Iteration] = field(default_factory=list)  # the comparison window's iterations
    recent: deque[Iteration] = field(default_factory=lambda: deque(maxlen=KEPT))  # later iterations of `main`
    timings: deque[StageTiming] = field(default_factory=lambda: deque(maxlen=KEPT))  # timed iterations of `main`
    last_timed: dict[str, StageTiming] = field(default_factory=dict)  # per what ran, its last timed iteration
    tails: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=KEPT))  # (all-reduce, tail)
    verdict: S.Verdict | None = None  # what the pairs decided (envpipe.runtime.phases.noharm)

    @property
    def digest(self) -> str:
        return plan_digest(self.runs)

    def judged(self, verdict: S.Verdict, baseline: Plan) -> None:
        """The pairs' verdict; what runs from now on is 1F1B all-max where it did not keep the plan."""
        self.verdict = verdict
        if not verdict.kept:
            self.runs, self.main = baseline, BASELINE

    def iterations(self) -> list[Iteration]:
        return [*self.compared, *self.recent]

    def add(self, it: Iteration) -> None:
        """A steady iteration whose energy is now known (the iteration log calls this in order)."""
        if len(self.compared) < 2 * self.pairs:
            self.compared.append(it)
        elif it.runs == self.main:
            self.recent.append(it)


def what_runs(rig: Rig, decision: Decision) -> tuple[Plan, str, int]:
    """(the plan the steady phase runs, PLAN or BASELINE, comparison pairs) for this rank."""
    plan = decision.plan_for(rig.place.replica)
    if rig.controls:
        return plan, PLAN, rig.cfg.compare_iterations
    if plan.orders() == rig.baseline.orders():
        return rig.baseline, BASELINE, 0  # 1F1B at default clocks: the baseline itself
    return plan, PLAN, rig.cfg.compare_iterations  # the plan's order at default clocks


def steady(rig: Rig, record: SteadyRecord, done_pairs: int, write_summary: Callable[[], None],
           judge: Callable[[], S.Verdict]) -> Phase[None]:
    """Run the plan forever (the user's loop decides how long); ``done_pairs``: pairs a resumed run already has;
    ``judge``: the verdict on the comparison pairs (a collective call)."""
    pairs = max(0, record.pairs - done_pairs)
    window = comparison_pattern(2 * pairs, pairs)
    progress("steady: the plan" + (f", its first {len(window)} iterations interleaved with 1F1B all-max iterations "
                                   "(this run's own, for the saving)" if window else ""))
    if window and not rig.has_run(record.runs):
        yield Step(record.runs, WARMUP, record.main, timed=False)
    first_report = max(len(window), 1)
    i = 0
    while True:
        runs = window[i] if i < len(window) else record.main
        timed = i % TIMED_EVERY == 0 or i == first_report - 1 or (rig.sim is not None)
        m = yield Step(record.runs if runs == PLAN else rig.baseline, STEADY, runs, timed)
        if m.timing.units:
            record.last_timed[runs] = m.timing
            if runs == record.main:
                record.timings.append(m.timing)
                units_end = max(b for *_, b in m.timing.units)
                record.tails.append((m.allreduce_s or 0.0, m.timing.step_end - units_end))
        i += 1
        if window and i == len(window):
            verdict = judge()
            record.judged(verdict, rig.baseline)
            progress(f"steady: {verdict.reason}")
        if i == first_report or (i > first_report and (i - first_report) % rig.cfg.summary_interval == 0):
            write_summary()

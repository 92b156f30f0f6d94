"""The calibration phase: 1F1B with every clock at max, every unit timed, on every rank.

From it: the simulator's inputs (envpipe.runtime.measure.timing: unit, overhead, transfer and tail times, per stage
its slowest replica), the straggler, every stage's unit energies and the power it draws while blocked on a
neighbour and in its tail (all-reduce, optimizer step) — each phase of an iteration is charged at its own
measured power —, the activation bytes each forward keeps and the stage's static memory
(envpipe.runtime.measure.memory), each stage's SM clock under load (NVML: the power cap's clock) and the GPU's idle
power. The first two iterations warm up (the first also meters memory); a simulated GPU fixes its unit
costs after the first.

How many (unless `calibration_iterations` fixes the count, which then runs no untimed ones either, and the
predictions are the simulator's alone): until the iteration time has settled, i.e. the median of
the last `SETTLE_WINDOW` job iteration times moved by at most `calibration_tolerance` from the median one iteration
earlier (at least `CALIBRATION_LEAST`, at most `calibration_max_iterations` iterations). A short or launch-bound
job's first iterations run slower than its later ones (a CNN pipeline on 4 x H200, 2026-11-28: the calibration's
median 14 % above the steady iterations'), and a prediction made from them misses by as much; the model takes the
settled iterations only, and the report says when the time never settled.

A real GPU's counter moves every 100 ms, too coarse to split a few-ms bubble from the units around it, so
there the blocking power is measured on its own (each GPU held 0.5 s in a collective) and every measured
iteration's waits are charged at it, the rest of the iteration's energy going to its units and tail
(`EnergySplit.charging_waits_at`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence

import numpy as np

from envpipe.energy.meter import EnergyMeter, clock_under_load
from envpipe.plan.memory import peak_in_flight
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime import summary as S
from envpipe.runtime.decision import CalibrationResult
from envpipe.runtime.measure import replicas
from envpipe.runtime.measure.collective import progress
from envpipe.runtime.measure.iterations import BASELINE
from envpipe.runtime.measure.memory import stage_memory, with_peak
from envpipe.runtime.measure.timing import StageTiming
from envpipe.runtime.rig import EnergySplit, Measured, Phase, Rig, Step

IDLE_S = 0.5  # how long the idle power is measured
BLOCKED_S = 0.5  # how long a GPU waits in a collective while its blocking power is measured
# Calibration iterations that only warm up (neither timed into the model nor metered). The second too: on
# 2 x H100 it read 1.0-7.3 % less energy than a steady iteration (medians per code version), the later ones
# -0.9 to +1.3 % (2026-11-27, benchmarks/results/dropin_h100x2.md, from 88c596a on).
WARMUP_ITERATIONS = 2
SETTLE_WINDOW = 3  # iterations whose median must hold still (the model then takes these and the one before)
# Then untimed 1F1B iterations, together at least ANCHOR_UPDATES of the counter's updates long (NVML's moves every
# 100 ms; a simulated GPU's is exact): the steady iterations are untimed, and unit timing (an event pair per unit
# and a synchronize) made the CNN example's timed iterations 8-10 % slower than its untimed ones on 2 x H200
# (2026-11-28). The predictions of what runs are anchored on them: the simulator's ratio of what runs to 1F1B,
# times these (envpipe.runtime.report.prediction).
ANCHOR_UPDATES, ANCHOR_LEAST, ANCHOR_MOST = 5, 3, 30


def median_change(times: Sequence[float], window: int = SETTLE_WINDOW) -> float | None:
    """How far the median of the last ``window`` times moved from the median one iteration earlier (relative);
    None with fewer than ``window + 1`` times."""
    if len(times) <= window:
        return None
    now, before = statistics.median(times[-window:]), statistics.median(times[-window - 1:-1])
    return float(now / before - 1.0)


def calibrate(rig: Rig) -> Phase[CalibrationResult]:
    cfg = rig.cfg
    least, most = cfg.calibration_range
    warmup = min(WARMUP_ITERATIONS, most - 1)
    progress(f"calibrate: {least} iteration(s) of 1F1B with every clock at max" if least == most else
             f"calibrate: 1F1B with every clock at max until the iteration time settles (within "
             f"{100 * cfg.calibration_tolerance:g} %; {least} to {most} iterations)")
    if rig.meter is not None and rig.meter.polled:
        rig.meter.sample_clocks = True
    own: list[StageTiming] = []
    times: list[float] = []  # the job's measured iterations (its slowest rank's time)
    saved, static = [0], 0
    change: float | None = None
    for i in range(most):
        if i == 1 or least == 1:  # after the first iteration every optimizer state exists
            static = rig.static_bytes()
        # The saved-tensor hooks slow an iteration (442 against 362 ms on 2 x H100, 2026-11-27) and lower its
        # power, so they ride on the first, warm-up iteration, which is neither timed into the model nor metered.
        m: Measured = yield Step(rig.baseline, "calibrate", BASELINE, measure_memory=i == 0)
        if m.saved_bytes is not None:
            saved = m.saved_bytes or [0]
        own.append(m.timing)
        if i < warmup:
            continue
        times.append(max(t for _, t in rig.gather(m.timing.step_end - m.timing.step_start)))
        change = median_change(times)
        if i + 1 >= least and change is not None and abs(change) <= cfg.calibration_tolerance:
            break
    settled = None if change is None else abs(change) <= cfg.calibration_tolerance
    if change is not None and not settled:
        progress(f"calibrate: the iteration time still moved {100 * change:+.1f} % after {len(own)} iterations: "
                 "the predictions are flagged")
    # The energies and the job's view only now, in one wait for the counter and one gather: the iterations ran
    # back to back, as steady ones do. Waiting after each left 40-115 ms idle gaps between them on 2 x H100
    # (2026-11-27), and each iteration then read about 6 % less energy than the same iteration back to back.
    anchor = (None, None, None) if least == most else (  # a fixed count is all there is: no anchor
        yield from _anchor(rig, statistics.median(times[-SETTLE_WINDOW:])))
    idle = _idle_power(rig)
    waiting = _blocked_power(rig)
    ran = len(own)
    own = own[-min(len(times), SETTLE_WINDOW + 1):]  # the settled iterations (at least the last)
    own_splits = [rig.energy(t, waiting) for t in own]
    splits = [x for x in own_splits if x is not None]
    measured = rig.gather_each([(t, EnergySplit.unit_means(x)) for t, x in zip(own, own_splits, strict=True)])
    iterations = [[(w, t) for w, (t, _) in it] for it in measured]
    cals = replicas.calibrate_replicas(one_f_one_b(rig.P, rig.M), iterations)
    entries = replicas.stage_entries(cals, iterations[-1])
    cal = replicas.job_calibration(cals, entries, rig.P)
    energies = replicas.slowest_with_energy(entries, [[e for _, (_, e) in it] for it in measured], rig.P)
    effective = _effective_clock(rig, own)
    blocking, tail, waiting_per_rank = _phase_powers(rig, splits, waiting, idle)
    limit = rig.memory_limit()
    mine = with_peak(stage_memory(int(np.median(saved)), static, limit, rig.cfg.memory_headroom,
                                  peak_in_flight(rig.baseline.orders())[rig.place.stage]), rig.peak_bytes())
    per_stage: dict[int, S.MemoryUse] = {}
    for w, mem in rig.gather(mine):  # a stage's largest replica decides
        cur = per_stage.get(w.stage)
        if cur is None or mem.activation_bytes_per_microbatch > cur.activation_bytes_per_microbatch:
            per_stage[w.stage] = mem
    used = [max(t.step_end - t.step_start for _, t in it) for it in iterations]
    spread = S.Spread.of(used)
    assert spread is not None
    report = S.Calibration(len(used), spread, cal.fwd_s, cal.bwd_s, cal.gap_s, cal.transfer_s, cal.tail_s,
                           cal.head_s, effective, idle, blocking, tail, ran, settled, change, *anchor)
    straggler = replicas.find_straggler(replicas.replica_times(entries), rig.cfg.straggler_threshold)
    return CalibrationResult(cal, report, [per_stage[s] for s in range(rig.P)], energies, straggler, idle, blocking,
                             tail, waiting_per_rank)


def _anchor(rig: Rig, typical_s: float) -> Phase[tuple[int | None, float | None, list[float] | None]]:
    """Untimed 1F1B iterations back to back: (how many, the job's median iteration, per stage every GPU's mean
    energy per iteration or None without a counter) (a collective at the end)."""
    resolution = rig.meter.resolution_s if rig.meter is not None else 0.0
    n = min(ANCHOR_MOST, max(ANCHOR_LEAST, math.ceil(ANCHOR_UPDATES * resolution / max(typical_s, 1e-9))))
    spans = []
    for _ in range(n):
        m: Measured = yield Step(rig.baseline, "calibrate", BASELINE, timed=False, extra={"anchor": True})
        spans.append((m.timing.step_start, m.timing.step_end))
    mine = None
    if rig.meter is not None and rig.meter.wait_until(spans[-1][1]):
        mine = sum(float(rig.meter.trace.between(a, b)) for a, b in spans) / n
    everyone = rig.gather(([b - a for a, b in spans], mine))
    times = [max(theirs[0][i] for _, theirs in everyone) for i in range(n)]
    per_stage: dict[int, float] = {}
    for w, (_, energy) in everyone:
        if energy is None:
            return n, statistics.median(times), None
        per_stage[w.stage] = per_stage.get(w.stage, 0.0) + energy
    return n, statistics.median(times), [per_stage[s] for s in range(rig.P)]


def _phase_powers(rig: Rig, splits: list[EnergySplit], waiting_w: float | None, idle_w: float | None
                  ) -> tuple[list[float] | None, list[float] | None, list[float | None]]:
    """Per stage, the power while blocked and in the tail, and every rank's ``waiting_w`` (a collective call).

    The tail's from the calibration's measured iterations; the blocking power measured blocked in a collective
    (``waiting_w``) where it was, else from the iterations' waits. Both pooled over the stage's replicas. Where
    a stage never waited (one stage: no bubbles) its blocking power is the idle GPU's."""
    mine = (sum(x.wait_j for x in splits), sum(x.wait_s for x in splits), sum(x.tail_j for x in splits),
            sum(x.tail_s for x in splits)) if splits else None
    pooled: dict[int, list[float]] = {}
    waited: dict[int, list[float]] = {}
    everyone = rig.gather((mine, waiting_w))
    per_rank = [blocked for _, (_, blocked) in everyone]  # in rank order
    for w, (sums, blocked) in everyone:
        if sums is None:
            return None, None, per_rank  # no energy counter on some rank: nothing measured
        acc = pooled.setdefault(w.stage, [0.0, 0.0, 0.0, 0.0])
        for k in range(4):
            acc[k] += sums[k]
        if blocked is not None:
            waited.setdefault(w.stage, []).append(blocked)
    blocking, tail = [], []
    fallback = idle_w if idle_w is not None else 0.0
    for s in range(rig.P):
        wait_j, wait_s, tail_j, tail_s = pooled[s]
        if s in waited:
            blocking.append(float(np.mean(waited[s])))
        else:
            blocking.append(wait_j / wait_s if wait_s > 1e-6 else fallback)
        tail.append(tail_j / tail_s if tail_s > 1e-6 else fallback)
    return blocking, tail, per_rank


def _blocked_power(rig: Rig) -> float | None:
    """This GPU's power while it waits in a collective for a rank that holds back (a collective call), over
    `BLOCKED_S`: a bubble's power, over a window a 100 ms counter resolves. Rank 0 holds back while every other
    rank waits, then rank 1 while rank 0 waits. None where the counter resolves bubbles itself (a simulated
    GPU's, whose knots are unit boundaries), without a counter, or alone (no one to wait for)."""
    meter = rig.meter
    polled = [mine for _, mine in rig.gather(meter is not None and meter.polled)]  # every rank or none waits
    if meter is None or not all(polled) or len(polled) < 2:
        return None
    me, window = rig.place.rank, (0.0, 0.0)
    rig.wait_in_collective()  # a group's communicator is made at its first use: outside the window
    for holder in (0, 1):
        t0 = time.perf_counter()
        if me == holder:
            time.sleep(BLOCKED_S)
        rig.wait_in_collective()
        if me != holder and window == (0.0, 0.0):
            window = (t0, time.perf_counter())
    return _mean_power(meter, *window)


def _effective_clock(rig: Rig, timings: list[StageTiming]) -> list[float | None]:
    """Per stage, the SM clock NVML saw during its units (the power cap's clock); None without NVML."""
    mine = None
    if rig.meter is not None and rig.meter.polled:
        rig.meter.sample_clocks = False
        busy = [(a, b) for t in timings for _, _, a, b in t.units]
        mine = clock_under_load(rig.meter.clock_samples, busy)
        if mine is None:  # units shorter than the polling period: the iterations, which are mostly busy
            mine = clock_under_load(rig.meter.clock_samples, [(t.step_start, t.step_end) for t in timings])
    per: dict[int, float] = {}
    for w, mhz in rig.gather(mine):  # a stage's slowest replica decides
        if mhz is not None:
            per[w.stage] = min(per.get(w.stage, mhz), mhz)
    return [per.get(s) for s in range(rig.P)]


def _idle_power(rig: Rig) -> float | None:
    """The idle GPU's power, measured from its counter over 0.5 s without work (a simulated GPU idles in its
    virtual time; the job's next iteration starts when every GPU is done)."""
    if rig.meter is None:
        return None
    if rig.sim is not None:
        t0 = rig.sim.now()
        t1 = rig.sim.idle(IDLE_S)
    else:
        t0 = time.perf_counter()
        time.sleep(IDLE_S)
        t1 = time.perf_counter()
    return _mean_power(rig.meter, t0, t1)


def _mean_power(meter: EnergyMeter, t0: float, t1: float) -> float | None:
    """The counter's mean power over [t0, t1]; None if it never reaches t1 (the counter stopped)."""
    if not meter.wait_until(t1):
        return None
    return float(meter.trace.between(t0, t1)) / (t1 - t0)

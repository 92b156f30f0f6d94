"""The calibration phase: 1F1B with every clock at max, every unit timed, on every rank.

From it: the simulator's inputs (envpipe.runtime.timing: unit, overhead, transfer and tail times, per stage
its slowest replica), the straggler, every stage's unit energies, the activation bytes each forward keeps
and the stage's static memory (envpipe.runtime.memory), each stage's SM clock under load (NVML: the power
cap's clock) and the GPU's blocking power. A simulated GPU fixes its unit costs after the first iteration.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from envpipe.energy.meter import PolledMeter, clock_under_load
from envpipe.plan.memory import peak_in_flight
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime import collective, replicas
from envpipe.runtime import summary as S
from envpipe.runtime.collective import progress
from envpipe.runtime.iterations import BASELINE
from envpipe.runtime.memory import SavedTensorMeter, device_limit, stage_memory, static_bytes
from envpipe.runtime.timing import Calibration, StageTiming

if TYPE_CHECKING:
    from envpipe.runtime.runner import Runner


@dataclass(frozen=True)
class Calibrated:
    timing: Calibration  # the simulator's inputs
    report: S.Calibration  # the same, with what else was measured, for the summary
    memory: list[S.MemoryUse]  # per stage
    unit_energies: list[dict[str, float]]  # per stage, its slowest replica's F, B (s) and F_j, B_j (J; nan: none)
    straggler: int | None  # a replica slower than the others' median by the threshold
    idle_power_w: float | None


def calibrate(runner: Runner, data: Iterator[Any], steps: int) -> Calibrated:
    engine, P = runner.engine, runner.P
    progress(f"calibrate: {steps} iteration(s) of 1F1B with every clock at max")
    if isinstance(runner.meter, PolledMeter):
        runner.meter.sample_clocks = True
    gathered, own, saved, static = [], [], [0], 0
    for i in range(max(1, steps)):
        if i == 1 or steps == 1:  # after the first iteration every optimizer state exists
            static = static_bytes(engine)
            engine.saved_meter = SavedTensorMeter(engine.module.parameters())
        timing = runner.run(data, runner.baseline, "calibrate", BASELINE)
        if engine.saved_meter is not None:
            saved, engine.saved_meter = engine.saved_meter.per_unit or [0], None
        own.append(timing)
        gathered.append(runner.gather((timing, runner.unit_energy(timing))))
        if i == 0 and runner.sim is not None:  # a simulated GPU's units keep the same cost from here on
            cpu_s, flops = collective.job_sum(list(runner.sim.calibration_work()))
            runner.sim.fix_unit_costs(flops / cpu_s if cpu_s > 0 else 0.0)
    measured = gathered[1:] or gathered  # the first iteration warms up
    iterations = [[(w, t) for w, (t, _) in it] for it in measured]
    cals = replicas.calibrate_replicas(one_f_one_b(P, runner.M), iterations)
    entries = replicas.stage_entries(cals, iterations[-1])
    cal = replicas.job_calibration(cals, entries, P)
    energies = replicas.slowest_with_energy(entries, [e for _, (_, e) in measured[-1]], P)
    effective = _effective_clock(runner, own[1:] or own)
    idle = _idle_power(runner)
    limit = device_limit(engine, runner.cfg.memory_limit_bytes)
    mine = stage_memory(int(np.median(saved)), static, limit, runner.cfg.memory_headroom,
                        peak_in_flight(runner.baseline.orders())[engine.stage_id])
    per_stage: dict[int, S.MemoryUse] = {}
    for w, m in runner.gather(mine):  # a stage's largest replica decides
        cur = per_stage.get(w.stage)
        if cur is None or m.activation_bytes_per_microbatch > cur.activation_bytes_per_microbatch:
            per_stage[w.stage] = m
    times = [max(t.step_end - t.step_start for _, t in it) for it in iterations]
    spread = S.Spread.of(times)
    assert spread is not None
    report = S.Calibration(len(times), spread, cal.fwd_s, cal.bwd_s, cal.gap_s, cal.transfer_s, cal.tail_s,
                           cal.head_s, effective, idle)
    straggler = replicas.find_straggler(replicas.replica_times(entries), runner.cfg.straggler_threshold)
    return Calibrated(cal, report, [per_stage[s] for s in range(P)], energies, straggler, idle)


def _effective_clock(runner: Runner, timings: list[StageTiming]) -> list[float | None]:
    """Per stage, the SM clock NVML saw during its units (the power cap's clock); None without NVML."""
    mine = None
    if isinstance(runner.meter, PolledMeter):
        runner.meter.sample_clocks = False
        busy = [(a, b) for t in timings for _, _, a, b in t.units]
        mine = clock_under_load(runner.meter.clock_samples, busy)
        if mine is None:  # units shorter than the polling period: the iterations, which are mostly busy
            mine = clock_under_load(runner.meter.clock_samples, [(t.step_start, t.step_end) for t in timings])
    per: dict[int, float] = {}
    for w, mhz in runner.gather(mine):  # a stage's slowest replica decides
        if mhz is not None:
            per[w.stage] = min(per.get(w.stage, mhz), mhz)
    return [per.get(s) for s in range(runner.P)]


def _idle_power(runner: Runner) -> float | None:
    """The blocking power the planner charges for waits: the model's on CPU, measured (0.5 s idle) on GPU."""
    if runner.sim is not None:
        return runner.sim.model.idle_power_w
    if runner.meter is None:
        return None
    t0 = time.perf_counter()
    time.sleep(0.5)
    t1 = time.perf_counter()
    runner.meter.wait_until(t1)
    return float(runner.meter.trace.between(t0, t1)) / (t1 - t0)


"""The phases of a run: calibrate -> profile -> decide -> reconfigure -> steady. Every rank calls `train`.

- calibrate: 1F1B with every clock at max; measured unit, transfer and tail times (envpipe.runtime.timing),
  the activation bytes each forward keeps, each stage's clock under load (NVML), the blocking power.
- profile: where clocks can be changed, one 1F1B iteration per profiled clock (time and energy of every
  unit); where they cannot, the calibration's units at default clocks and the frequency model (simulated).
- decide: rank 0 chooses (envpipe.runtime.decide) and broadcasts; a planning error is raised on every rank.
- reconfigure: the optimal policy re-plans from the measured units until the plan's iterations, measured
  pair by pair against 1F1B all-max iterations, are within budget; EnvPipe's policies raise clocks on the
  measured critical path (greedy, balanced).
- steady: the plan, interleaved at first with 1F1B all-max iterations (ABBA), so that the report compares
  measured with measured; then rank 0 writes summary.json (envpipe.runtime.summary) and the Gantt picture.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from envpipe.energy.accounting import account
from envpipe.plan.schedules import one_f_one_b
from envpipe.profile import Profile
from envpipe.runtime import collective
from envpipe.runtime import summary as S
from envpipe.runtime.calibrate import Calibrated, calibrate
from envpipe.runtime.clocks import Clock, energy_label, make_meter, simulated_gpu
from envpipe.runtime.collect import RankRecord, assemble
from envpipe.runtime.collective import progress
from envpipe.runtime.config import REPLAN, EnvPipeConfig
from envpipe.runtime.decide import (
    Decision,
    all_max,
    envpipe_rule,
    from_plan_file,
    plan_digest,
    with_planner,
    with_straggler_rule,
)
from envpipe.runtime.engine import EnvPipeEngine
from envpipe.runtime.iterations import BASELINE, PLAN, Iteration, IterationLog, comparison_pattern
from envpipe.runtime.profiling import stage_profile
from envpipe.runtime.reconfigure import raise_measured, replan_until_within_budget
from envpipe.runtime.timing import Calibration, StageTiming

STEADY_ACCOUNTED = 50  # unit energy in the summary: over the last (up to) this many timed steady iterations
# Steady iterations time their units (CUDA events and a synchronize before the loss broadcast) only
# every this many iterations and on the last one; every iteration still reports its time and energy.
# Why: on 2 x H200 the runtime timing every iteration ran about 4 ms per iteration (1-2.5%) slower than
# the same engine untimed (measured, benchmarks/results/runtime_h200.md).
STEADY_TIMED_EVERY = 10


class Runner:
    def __init__(self, engine: EnvPipeEngine, cfg: EnvPipeConfig, clock: Clock | None, samples_per_iteration: int):
        self.engine, self.cfg, self.clock = engine, cfg, clock
        self.samples = samples_per_iteration
        self.P, self.M = engine.num_stages, engine.micro_batches
        self.dp = engine.grid.get_data_parallel_world_size()
        self.place = collective.place(engine)
        self.controls = clock is not None and clock.controls_clocks
        self.meter = make_meter(clock)
        self.sim = simulated_gpu(clock)  # CPU: times are the simulated GPU's virtual time
        self.log = IterationLog(cfg.report_dir, self.place.rank, engine.stage_id, self.meter, energy_label(clock))
        self.f_max = clock.supported_mhz[0] if clock is not None else 0
        self.baseline = all_max(one_f_one_b(self.P, self.M), self.f_max, "1f1b", "baseline")
        self.last_timing: StageTiming | None = None
        self._steady_timings: list[StageTiming] = []
        self._tails: list[tuple[str, float, float]] = []  # steady timed iterations: (what ran, all-reduce, tail)
        self._main = PLAN  # what the steady phase runs

    # --- one iteration ---------------------------------------------------------------------------
    def run(self, data: Iterator[Any], plan: Any, phase: str, runs: str = PLAN, timed: bool = True,
            extra: dict[str, Any] | None = None) -> StageTiming:
        """One training iteration of ``plan`` (orders and clocks); clocks only where they can be changed."""
        engine = self.engine
        engine.set_unit_orders(plan.orders(), plan.clocks() if self.controls else None, self.clock, timing=timed)
        requested = list(self.clock.requested) if self.clock is not None else []
        t0 = self._iteration_edge()
        loss = engine.train_batch(data)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t1 = self._iteration_edge()
        asked = list(self.clock.requested[len(requested):]) if self.clock is not None else []
        value = float(loss) if loss is not None else None
        self.log.add(Iteration(len(self.log.done) + len(self.log._waiting), phase, runs, t0, t1, asked, value,
                               bool(engine.units), extra or {}))
        progress(f"{phase:<12} {runs:<8} loss {value:.4f}  {t1 - t0:.3f} s" if value is not None else phase)
        h = engine.iteration_host_t0
        self.last_timing = StageTiming(engine.stage_id, t0, t1,
                                       [(u.kind, u.mb, h + u.start_s, h + u.end_s) for u in engine.units])
        if phase == "steady" and engine.units:
            units_end = max(u.end_s for u in engine.units)
            self._tails.append((runs, engine.allreduce_s or 0.0, t1 - (h + units_end)))
        return self.last_timing

    def _iteration_edge(self) -> float:
        """When an iteration starts or ends: host time, or a simulated GPU's virtual time, which every rank
        then agrees on (the job's collectives make every GPU wait for the last one)."""
        if self.sim is None:
            return time.perf_counter()
        self.sim.sync(collective.job_max(self.sim.now()))
        return self.sim.now()

    def gather(self, mine: Any) -> list[tuple[collective.Place, Any]]:
        """Every rank's object with its place (stage, replica), in rank order (a collective call)."""
        return collective.gather((self.place, mine))

    def unit_energy(self, timing: StageTiming) -> tuple[float | None, float | None, float | None]:
        """(mean F, mean B energy, power outside units) of one iteration, from the meter at unit boundaries."""
        if self.meter is None or not timing.units or not self.meter.wait_until(timing.step_end):
            return None, None, None
        it = account(self.meter.trace, [(a, b) for _, _, a, b in timing.units], timing.step_start, timing.step_end)
        kinds = [k for k, *_ in timing.units]
        return it.mean(kinds, "F"), it.mean(kinds, "B"), it.idle_power_w

    # --- phases -----------------------------------------------------------------------------------
    def decide(self, data: Iterator[Any], calibrated: Calibrated) -> Decision:
        profile = stage_profile(self, data, calibrated)
        choice: Any = None
        if tdist.get_rank() == 0:
            try:
                choice = self._choose(profile, calibrated)
            except Exception as exc:  # every rank raises it, none waits for a plan that never comes
                choice = collective.portable(exc)
        chosen: Decision = collective.agree(choice)
        progress(f"decide: {chosen.info.policy}, order {chosen.info.order}; from {chosen.info.source}")
        return chosen

    def _choose(self, profile: Profile | None, calibrated: Calibrated) -> Decision:
        cfg, cal, memory = self.cfg, calibrated.timing, calibrated.memory
        if cfg.plan:
            return from_plan_file(cfg.plan, self.P, self.M, cal, self.dp)
        if profile is None:
            return envpipe_rule(cfg, self.P, self.M, cal, self.f_max, self.dp, memory)
        if profile.num_stages != self.P:
            raise ValueError(f"profile {profile.source} has {profile.num_stages} stages, the pipeline {self.P}")
        idle = self.idle_power_w
        online = self.controls and cfg.reconfig_method != "default"
        chosen = with_planner(cfg, profile, self.M, cal, idle, self.dp, memory, self.controls, online)
        if calibrated.straggler is not None and cfg.straggler == "frontier" and self.dp > 1:
            chosen = with_straggler_rule(chosen, profile, calibrated.straggler, cal, idle, cfg.scheduling)
        return chosen

    def reconfigure(self, data: Iterator[Any], chosen: Decision, cal: Calibration
                    ) -> tuple[Decision, S.Reconfiguration | None]:
        method = self.cfg.reconfig_method
        if not self.controls or method == "default" or chosen.info.source.startswith("plan file"):
            return chosen, None
        if chosen.straggler_rule is not None and chosen.straggler_rule.applied:
            return chosen, None  # the replicas run different plans: one set of raises cannot fit both
        if method == REPLAN:
            return replan_until_within_budget(self, data, chosen, cal)
        return raise_measured(self, data, chosen, cal, method)

    def steady(self, data: Iterator[Any], chosen: Decision, steps: int) -> None:
        deployed = chosen.info.deployed and self.controls
        plan = chosen.plan_for(self.place.replica) if deployed else self.baseline
        pairs = self.cfg.compare_iterations if deployed else 0
        progress(f"steady: {steps} iterations" + (f", the first {2 * min(pairs, steps // 2)} interleaved with 1F1B "
                                                  "all-max iterations (measured against measured)" if pairs else ""))
        if self.engine.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        main = self._main = PLAN if deployed else BASELINE  # without clock control: 1F1B at default clocks
        pattern = comparison_pattern(steps, pairs) if deployed else [BASELINE] * steps
        for i, runs in enumerate(pattern):
            timed = i % STEADY_TIMED_EVERY == 0 or i == steps - 1 or (self.clock is not None and
                                                                        self.clock.needs_unit_times)
            timing = self.run(data, plan if runs == PLAN else self.baseline, "steady", runs, timed)
            if runs == main and timing.units:
                self._steady_timings = [*self._steady_timings[-STEADY_ACCOUNTED + 1:], timing]
                oldest = self.log.oldest_unwritten_start()
                if self.meter is not None:  # bounded memory on long runs
                    keep = self._steady_timings[0].step_start
                    self.meter.trace.trim(keep if oldest is None else min(keep, oldest))

    def train(self, data: Iterator[Any], steps: int, calibration_steps: int = 2) -> S.RunSummary | None:
        calibrated = calibrate(self, data, calibration_steps)
        self.idle_power_w = calibrated.idle_power_w or 0.0
        chosen = self.decide(data, calibrated)
        chosen, reconfiguration = self.reconfigure(data, chosen, calibrated.timing)
        self.steady(data, chosen, steps)
        return self.finish(chosen, calibrated, reconfiguration)

    def finish(self, chosen: Decision, calibrated: Calibrated, reconfiguration: S.Reconfiguration | None
               ) -> S.RunSummary | None:
        """Gather every rank's record; rank 0 assembles and writes the summary (a collective call)."""
        self.log.close()
        engine = self.engine
        peak = (torch.cuda.max_memory_allocated() if engine.device.type == "cuda" else None)
        energies = [self.unit_energy(t) for t in self._steady_timings]
        unit = S.UnitEnergy(*[_mean([e[k] for e in energies]) for k in range(3)]) if energies else None
        if self.meter is not None:
            self.meter.close()
        units = [S.MeasuredUnit(u.kind, u.mb, u.start_s, u.end_s, u.mhz) for u in engine.units]
        ran = chosen.plan_for(self.place.replica) if chosen.info.deployed and self.controls else self.baseline
        refusals = [S.Refusal(self.place.rank, r.mhz, r.status, r.message) for r in
                    (self.clock.refusals() if self.clock is not None else [])]
        record = RankRecord(self.place, self.log.steady(), peak, unit, units, plan_digest(ran),
                            [a for r, a, _ in self._tails if r == self._main],
                            [t for r, _, t in self._tails if r == self._main], refusals)
        everyone = collective.gather(record)
        if tdist.get_rank() != 0:
            return None
        summary = assemble(everyone, self.cfg, self.clock, chosen, calibrated.report, reconfiguration,
                           calibrated.timing, self.samples, self.M, calibrated.straggler)
        from envpipe.runtime.report import write_report

        write_report(self.cfg.report_dir, summary)
        chosen.plan_for(0).save(Path(self.cfg.report_dir) / "plan.json")  # run it again with --plan
        return summary



def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None

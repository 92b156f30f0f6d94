"""EnvPipe's phases inside the user's own `train_batch()` calls: calibrate -> profile -> decide -> reconfigure
-> steady.

`EnvPipeRun` is attached to the engine by `envpipe.initialize`. Each `train_batch()` runs the iteration the
current phase asked for (a `Step`: plan, phase, what runs) and hands the phase what it measured; a phase
generator (envpipe.runtime.rig) then decides the next step. Every rank makes the same calls in the same
order, so the phases' collectives meet.

- calibrate (envpipe.runtime.phases.calibrate): 1F1B with every clock at max; unit, transfer and tail times,
  activation bytes, each stage's clock under load and its blocking and tail power.
- profile (envpipe.runtime.phases.profiling): one iteration per profiled clock, or the frequency model where
  clocks cannot be changed.
- decide (rank 0, envpipe.runtime.phases.decide, broadcast; a planning error is raised on every rank).
- reconfigure (envpipe.runtime.phases.reconfigure): re-plan from measured units until within budget (optimal), or
  EnvPipe's raises on the measured critical path (greedy, balanced).
- rehearse (envpipe.runtime.phases.rehearse, `rehearse: true` where clocks cannot be set): the plan's units stretched by
  their planned clocks' extra time, interleaved with 1F1B all-max iterations: the plan's timing, measured.
- steady (envpipe.runtime.phases.steady): the plan, interleaved at first with 1F1B all-max iterations, so that
  the report compares measured with measured; what measured slower than the budget or dearer than 1F1B gives way
  to 1F1B all-max (envpipe.runtime.phases.noharm); for as long as the user's loop runs; the report is rewritten at
  intervals.

What was decided (`Decided`) travels in DeepSpeed checkpoints (envpipe.runtime.state): a resumed job goes
straight to the steady plan unless the job's shape or model changed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from envpipe.runtime import state
from envpipe.runtime import summary as S
from envpipe.runtime.clocks import Clock, energy_label, simulated_gpu, time_label
from envpipe.runtime.config import REPLAN, EnvPipeConfig
from envpipe.runtime.decision import CalibrationResult, Decided, Decision, Job, Origin
from envpipe.runtime.measure import collective
from envpipe.runtime.measure.collective import progress
from envpipe.runtime.measure.iterations import PLAN, Iteration, IterationLog, job_iterations, paired
from envpipe.runtime.measure.memory import SavedTensorMeter
from envpipe.runtime.measure.timing import StageTiming
from envpipe.runtime.phases import decide, noharm
from envpipe.runtime.phases.calibrate import calibrate
from envpipe.runtime.phases.profiling import stage_profile
from envpipe.runtime.phases.reconfigure import raise_measured, replan_until_within_budget
from envpipe.runtime.phases.rehearse import lowers_clocks, rehearse
from envpipe.runtime.phases.steady import STEADY, SteadyRecord, steady, what_runs
from envpipe.runtime.report import prediction
from envpipe.runtime.report.collect import RankRecord, Reported, assemble
from envpipe.runtime.report.monitor import MonitorFeed
from envpipe.runtime.rig import Measured, Phase, Rig, Step
from envpipe.simgpu import JobTruth

log = logging.getLogger(__name__)
SLOW_FACTOR = 2.0  # a measured iteration this many times its prediction gets one warning line


class EnvPipeRun:
    def __init__(self, engine: Any, cfg: EnvPipeConfig, clock: Clock | None) -> None:
        self.engine, self.cfg, self.clock = engine, cfg, clock
        self.rig = Rig(engine, cfg, clock)
        sim = simulated_gpu(clock) is not None
        monitor = engine.monitor.write_events if getattr(engine, "monitor", None) and engine.monitor.enabled else None
        self.monitor = MonitorFeed(monitor, "simulated" if sim else "measured", sim)
        self.log: IterationLog | None = None  # opened at the first iteration (a resumed run appends)
        self.planned: Decided | None = None
        self.record: SteadyRecord | None = None
        self.rehearsal: S.Rehearsal | None = None
        self.summary: S.RunSummary | None = None  # rank 0: the latest report written
        self.resumed = False
        self._drawn: str | None = None  # the plan digest the Gantt picture shows
        self._warned_slow = False
        self._closed = False
        self._oracle_for: tuple[str, S.OracleComparison] | None = None
        self._steady_runs = 0  # steady iterations run (every rank counts alike; the record's lag behind the meter)
        self.shape = self._job_shape()
        self._program = self._phases(None, 0)
        self._next: Step | None = None  # the first step is asked for at the first iteration: a checkpoint loaded
        # before it (load_state) starts the phases over without a calibration line in the log

    def _job_shape(self) -> state.JobShape:
        """The job's shape and each stage's model digest (a collective call)."""
        engine, rig = self.engine, self.rig
        stages: dict[int, str] = {}
        for w, digest in rig.gather(state.model_digest(engine.module.named_parameters())):
            stages.setdefault(w.stage, digest)
        return state.JobShape(collective.world_size(), rig.P, rig.dp, rig.M,
                              int(engine.train_micro_batch_size_per_gpu()), [stages[s] for s in range(rig.P)])

    @property
    def _step(self) -> Step:
        """The iteration the current phase asks for (the phases start at the first one)."""
        if self._next is None:
            self._next = next(self._program)
        return self._next

    # --- one iteration, inside the user's train_batch() ---------------------------------------------
    def train_batch(self, run: Callable[[], Any]) -> Any:
        engine, rig, step = self.engine, self.rig, self._step
        engine.set_unit_orders(step.plan.orders(), step.plan.clocks() if rig.controls else None, self.clock,
                               timing=step.timed, stretch=step.stretch)
        if step.measure_memory:
            engine.saved_meter = SavedTensorMeter(engine.module.parameters())
        t0 = rig.edge()
        loss = run()
        if rig.on_gpu:
            torch.cuda.synchronize()
        t1 = rig.edge()
        saved = None
        if engine.saved_meter is not None:
            saved, engine.saved_meter = engine.saved_meter.per_unit, None
            if engine.graphs is not None:  # the metering iteration ran eagerly
                engine.graphs.eager_done()
        value = float(loss.mean()) if isinstance(loss, torch.Tensor) else None
        h = engine.iteration_host_t0
        timing = StageTiming(engine.stage_id, t0, t1, [(u.kind, u.mb, h + u.start_s, h + u.end_s)
                                                       for u in engine.units])
        it = Iteration(int(engine.global_steps), step.phase, step.runs, t0, t1, time.time(),
                       rig.samples_per_iteration, int(engine.global_samples), list(engine.clocks_requested), value,
                       bool(engine.units), dict(step.extra))
        self._log().add(it)
        self._steady_runs += step.phase == STEADY
        self._next = self._program.send(Measured(timing, value, saved, engine.allreduce_s, engine.stretched()))
        if it.index % self.cfg.monitor_interval == 0:
            self.monitor.flush()
        self._trim_meter()
        return loss

    def _log(self) -> IterationLog:
        if self.log is None:
            path = Path(self.cfg.report_dir) / f"iterations.rank{self.rig.place.rank}.jsonl"
            if not self.resumed and path.exists():
                path.unlink()  # a new run: its own lines only
            self.log = IterationLog(path, self.engine.stage_id, self.rig.meter,
                                    (energy_label(self.clock), time_label(self.clock)), self._done)
        return self.log

    def _done(self, it: Iteration) -> None:
        """An iteration whose energy is known: the progress line, the monitor, the steady record."""
        self.monitor.add(it, self.engine.stage_id)
        if it.phase == STEADY and self.record is not None:
            self.record.add(it)
        every = self.cfg.log_interval
        if every and it.index % every == 0:
            energy = "" if it.energy_j is None else f"  {it.energy_j:.2f} J (rank 0's GPU, {self.monitor.kind})"
            loss = "" if it.loss is None else f"  loss {it.loss:.4f}"
            total = self.cfg.progress_total
            step = f"{it.index}/{total}" if total else f"{it.index}"
            progress(f"{step:>9} {it.phase:<13} {it.runs:<8}{loss}  {it.time_s:.3f} s{energy}")
        self._check_prediction(it)

    def _check_prediction(self, it: Iteration) -> None:
        """One warning line when a steady plan iteration takes more than SLOW_FACTOR x its prediction."""
        if self._warned_slow or self.planned is None or it.phase != STEADY or self.record is None:
            return
        predicted = self.planned.decision.predicted_time_s
        if it.runs == self.record.main and predicted and it.time_s > SLOW_FACTOR * predicted:
            self._warned_slow = True
            progress(f"warning: iteration {it.index} took {it.time_s:.3f} s, over {SLOW_FACTOR:g}x the predicted "
                     f"{predicted:.3f} s: the machine is slower than when the run was calibrated (other load, "
                     "fewer threads, a throttled GPU?)")

    def _trim_meter(self) -> None:
        """Bounded memory on long runs: the counter trace is kept from the oldest iteration still needed."""
        meter, record = self.rig.meter, self.record
        if meter is None or record is None or not record.timings or self.log is None:
            return
        keep = record.timings[0].step_start
        oldest = self.log.oldest_unwritten_start()
        meter.trace.trim(keep if oldest is None else min(keep, oldest))

    # --- the phases -----------------------------------------------------------------------------------
    def _phases(self, restored: Decided | None, done_pairs: int, verdict: S.Verdict | None = None
                ) -> Phase[None]:
        """The phases; a resumed run starts from what its checkpoint decided (and what its pairs kept)."""
        rig, cfg = self.rig, self.cfg
        if restored is None:
            calibrated = yield from calibrate(rig)
            profile = yield from stage_profile(rig, calibrated)
            job = Job(rig.P, rig.M, rig.dp, rig.controls, rig.f_max)
            chosen = collective.decided(lambda: decide.choose(cfg, job, calibrated, profile))
            progress(f"decide: {chosen.policy}, order {chosen.order}; from {chosen.source}")
            chosen, reconfiguration = yield from self._reconfigure(chosen, calibrated)
            self.planned = Decided(calibrated, chosen, reconfiguration)
            if cfg.rehearse and rig.controls:
                progress("rehearse: clocks can be set here, so the plan runs with its clocks; no rehearsal")
            elif cfg.rehearse and not lowers_clocks(chosen, rig.f_max):
                progress("rehearse: the plan lowers no clock, so there is nothing to stretch; the steady pairs "
                         "measure its order")
            elif cfg.rehearse:
                self.rehearsal = yield from rehearse(rig, chosen)
        else:
            self.planned = restored
        plan, main, pairs = what_runs(rig, self.planned.decision)
        self.record = SteadyRecord(plan, main, pairs)
        if verdict is not None:
            self.record.judged(verdict, rig.baseline)
            self.monitor.plan_kept = verdict.kept
        predicted = self.planned.decision.predicted
        self.monitor.saving_planned = None if predicted is None else predicted.energy_saving
        yield from steady(rig, self.record, done_pairs, self.write_summary, self._judge)

    def _judge(self) -> S.Verdict:
        """The no-harm verdict on the steady phase's comparison pairs, the same on every rank (a collective call)."""
        assert self.record is not None and self.planned is not None
        self._log().write_known(wait=True)  # every compared iteration has its energy
        mine = [(it.runs, it.time_s, it.energy_j) for it in self.record.compared]
        pairs = paired(job_iterations(collective.gather(mine)))
        cfg, decision = self.cfg, self.planned.decision
        allowed = cfg.max_slowdown or 0.0
        if cfg.time_budget_s is not None:
            allowed = cfg.time_budget_s / statistics.median(b[0] for _, b in pairs) - 1.0
        what = "the plan" if self.rig.controls else f"the plan's order, {decision.order}, at default clocks"
        verdict = noharm.judge(pairs, allowed, self.rig.controls, what,
                               "simulated GPU" if self.rig.sim is not None else "measured")
        self.monitor.plan_kept = verdict.kept
        return verdict

    def _reconfigure(self, chosen: Decision, calibrated: CalibrationResult
                     ) -> Phase[tuple[Decision, S.Reconfiguration | None]]:
        method, rig = self.cfg.reconfig_method, self.rig
        rehearsed = not rig.controls and self.cfg.rehearse  # the plan's clocks stood in for by stretches
        if method == "default" or chosen.origin == Origin.PLAN_FILE:
            return chosen, None
        if chosen.straggler_rule is not None and chosen.straggler_rule.applied:
            return chosen, None  # the replicas run different plans: one set of raises cannot fit both
        if method == REPLAN and (rig.controls or (rehearsed and lowers_clocks(chosen, rig.f_max))):
            return (yield from replan_until_within_budget(rig, chosen, calibrated, rehearsed))
        if not rig.controls:
            return chosen, None  # nothing to rehearse, or EnvPipe's raises, which need clocks that move
        return (yield from raise_measured(rig, chosen, calibrated, method))

    # --- the report -----------------------------------------------------------------------------------
    def report(self) -> S.RunSummary | None:
        """The report now (a collective call); None before the steady phase (one line says so)."""
        if self.record is None or not self._steady_runs:  # the same on every rank: the collective below meets
            progress(f"no report yet: the run is in its {self._step.phase} phase (the report starts with the "
                     "steady phase's first iteration)")
            return None
        self.write_summary()
        return self.summary if collective.rank() == 0 else None

    def write_summary(self) -> None:
        """Gather every rank's record; rank 0 assembles and writes the report (a collective call)."""
        assert self.planned is not None and self.record is not None
        log = self._log()
        log.write_known(wait=True)  # every steady iteration so far has its energy
        self.monitor.flush()  # and reaches the monitors, the last ones included
        record, planned = self.record, self.planned
        peak = torch.cuda.max_memory_allocated() if self.rig.on_gpu else None
        waiting_w = planned.calibrated.waiting_power_of(self.rig.place.rank)
        energies = [self.rig.energy(t, waiting_w) for t in record.timings]  # split as calibrated
        unit = S.UnitEnergy(_mean([e.fwd_j for e in energies if e]), _mean([e.bwd_j for e in energies if e]),
                            _mean([e.wait_j / e.wait_s for e in energies if e and e.wait_s > 0])) if energies else None
        last = record.last_timed.get(record.main)
        clocks = {(u.kind, u.mb): u.freq_mhz for u in record.runs.stages[self.engine.stage_id]}
        units = [] if last is None else [
            S.MeasuredUnit(k, mb, a - last.step_start, b - last.step_start, clocks[(k, mb)] if self.rig.controls
                           else None) for k, mb, a, b in last.units]
        refusals = [] if self.clock is None else self.clock.refusals(self.rig.place.rank)
        lost = None if self.clock is None else self.clock.lost_control()
        mine = RankRecord(self.rig.place, [(it.runs, it.time_s, it.energy_j) for it in record.iterations()], peak,
                          unit, units, record.digest, [a for a, _ in record.tails], [t for _, t in record.tails],
                          refusals, lost)
        everyone = collective.gather(mine)
        flops = self.rig.gather(None if self.rig.sim is None else self.rig.sim.unit_flops)
        if collective.rank() != 0:
            return
        reported = Reported("envpipe", record.main, self.rig.samples_per_iteration, self.rig.M,
                            [it.wall_time for it in record.iterations() if it.runs == record.main])
        summary = assemble(everyone, self.cfg, self.clock, planned, reported)
        energy = self._energy_prediction(everyone)
        summary = replace(summary, energy=energy, oracle=self._oracle(flops), verdict=record.verdict,
                          rehearsal=self.rehearsal)
        summary = replace(summary, trust=prediction.trust(summary))
        from envpipe.runtime.report.files import write_report

        draw = self._drawn != record.digest
        write_report(self.cfg.report_dir, summary, gantt=draw)
        self._drawn = record.digest
        planned.decision.plan_for(0).save(Path(self.cfg.report_dir) / "plan.json")  # run it again with `plan`
        self.summary = summary
        self.monitor.trusted = summary.trust.trusted if summary.trust is not None else None

    def _energy_prediction(self, records: list[RankRecord]) -> S.EnergyPrediction | None:
        assert self.planned is not None and self.record is not None
        record, rig = self.record, self.rig
        what = prediction.ran(record.runs, not rig.controls, rig.f_max) if record.main == PLAN else rig.baseline
        return prediction.energy_prediction(records, record.main, what, self.planned, energy_label(self.clock))

    def _oracle(self, flops: list[tuple[collective.Place, dict[str, float] | None]]) -> S.OracleComparison | None:
        """On simulated GPUs: the saving a planner knowing their hidden truth finds (computed once per plan)."""
        assert self.planned is not None and self.record is not None
        per_stage = {w.stage: (f["F"], f["B"]) for w, f in flops if f and {"F", "B"} <= set(f)}
        if len(per_stage) < self.rig.P:
            return None
        if self._oracle_for is None or self._oracle_for[0] != self.record.digest:
            truth = JobTruth.embedded(self.rig.P)
            stages = [truth.stage(s) for s in range(self.rig.P)]
            gpu = prediction.GpuTruth(truth.oracle_profile([per_stage[s] for s in range(self.rig.P)]),
                                      [x.blocking_w for x in stages],
                                      [x.tail_power_w(truth.clocks_mhz[0]) for x in stages], truth.name)
            oracle = prediction.oracle_comparison(self.cfg, gpu, self.record.runs, self.planned.calibrated)
            self._oracle_for = (self.record.digest, oracle)
        return self._oracle_for[1]

    # --- checkpoints --------------------------------------------------------------------------------------
    def save_state(self, folder: Path) -> None:
        """What was decided, into a checkpoint's folder (rank 0 writes; nothing before the steady phase)."""
        if self.planned is None or self.record is None or collective.rank() != 0:
            return
        done = min(self.record.pairs, len(self.record.compared) // 2)
        why = state.write(folder, self.shape, self.planned, done, self.record.verdict)
        if why:
            progress(f"checkpoint {folder}: EnvPipe's state not saved ({why}); a resume from it profiles again")

    def load_state(self, folder: Path) -> None:
        """Resume from a checkpoint's folder in its steady plan, or say in one line why not and start the phases
        again (a collective call: rank 0 reads, every rank resumes alike)."""
        found = collective.decided(lambda: state.load(folder, self.shape))
        restored, pairs = (None, 0) if isinstance(found, str) else (state.from_state(found), found.pairs_done)
        verdict = None if isinstance(found, str) else found.verdict
        why = found if isinstance(found, str) else ""
        progress(f"resume: {why}; calibrating and profiling again" if restored is None else
                 f"resume: the steady plan of checkpoint {folder} ({restored.decision.order}), no profiling")
        self.resumed = True
        self._program.close()
        self._program = self._phases(restored, pairs, verdict)
        self._next = None

    def close(self) -> None:
        """End of the job (atexit, SIGTERM, engine.destroy): the last lines, the meter, default clocks."""
        if self._closed:
            return
        self._closed = True
        if self.log is not None:
            self.log.close()
        if self.rig.meter is not None:
            self.rig.meter.close()
        if self.clock is not None:
            self.clock.close()


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None

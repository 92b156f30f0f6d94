"""Phases of a run: calibrate (1F1B, measured unit/transfer/tail times), plan (a plan file, EnvPipe's
rule, or profile + the planner), reconfigure (from measured waits), steady state.

Every rank calls `train` with its EnvPipeEngine; rank 0 writes the summary and the Gantt picture.
With data-parallel replicas (envpipe.runtime.replicas) every replica measures, each stage is planned
for its slowest replica, rank 0 decides and broadcasts the plan, and the summary covers the whole job.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from envpipe.energy.accounting import account
from envpipe.energy.meter import EnergyMeter, PolledMeter, SimMeter, nvml_reader
from envpipe.plan.schedules import Unit, one_f_one_b
from envpipe.profile import Profile, load_profile
from envpipe.runtime import replicas
from envpipe.runtime.clocks import Clock, NvmlEnergyClock, SimClock
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.engine import EnvPipeEngine
from envpipe.runtime.jobreport import RankRecord, job_summary
from envpipe.runtime.plans import RunPlan, builtin_plan, load_plan
from envpipe.runtime.reconfigure import reconfigure_online
from envpipe.runtime.report import Reporter, summarize, write_summary
from envpipe.runtime.timing import Calibration, StageTiming, measured_timeline, predict_time

log = logging.getLogger(__name__)
STEADY_ACCOUNTED = 50  # unit energy in the summary: over the last (up to) this many steady iterations
# Steady iterations time their units (CUDA events and a synchronize before the loss broadcast) only
# every this many iterations and on the last one; every iteration still reports its time and energy.
# Why: on 2 x H200 the runtime timing every iteration ran about 4 ms per iteration (1-2.5%) slower than
# the same engine untimed (measured, benchmarks/results/runtime_h200.md).
STEADY_TIMED_EVERY = 10


def make_meter(clock: Clock | None, engine: EnvPipeEngine) -> EnergyMeter | None:
    """The simulated GPU's exact counter, or this GPU's NVML counter polled in the background."""
    sim = clock if isinstance(clock, SimClock) else getattr(clock, "emulated", None)
    if sim is not None:
        return SimMeter(sim.trace, sim.energy_j)
    if clock is None or engine.device.type != "cuda":
        return None
    if isinstance(clock, NvmlEnergyClock):  # polls the clock's own NVML counter: no second NVML session
        return PolledMeter(clock.energy_j)
    read, shutdown = nvml_reader(engine.device.index or 0)
    return PolledMeter(read, on_close=shutdown)


def profile_clocks(supported_mhz: list[int], count: int) -> list[int]:
    """`count` clocks spread evenly over the supported ones, from the highest to the lowest."""
    clocks = sorted(set(supported_mhz), reverse=True)
    if count < 2 or len(clocks) <= count:
        return clocks[: max(1, count)]
    return [clocks[round(i * (len(clocks) - 1) / (count - 1))] for i in range(count)]


def _requested(clock: Clock | None) -> list[int]:
    return list(getattr(clock, "requested", []))


class Runner:
    def __init__(
        self,
        engine: EnvPipeEngine,
        cfg: EnvPipeConfig,
        clock: Clock | None,
        samples_per_iteration: int,
        profile_points: int = 4,
        reconfigure_rounds: int = 20,
    ):
        self.engine, self.cfg, self.clock = engine, cfg, clock
        self.samples = samples_per_iteration
        label = clock.energy_label if clock is not None else "none"
        self.reporter = Reporter(cfg.report_dir, tdist.get_rank(), engine.stage_id, label)
        self.meter = make_meter(clock, engine)
        self._iteration = 0
        self.profile_points = profile_points
        self.reconfigure_rounds = reconfigure_rounds
        self.idle_power_w: float | None = None
        self.last_timing: StageTiming | None = None
        self._steady: list[StageTiming] = []
        self.reconfig_log: dict[str, Any] | None = None
        self.calibration: Calibration | None = None
        self.place = replicas.place(engine)
        self.straggler: int | None = None  # a straggling replica (calibration, then profiling iterations)
        self.fast_profile: Profile | None = None  # the other replicas' profile when there is a straggler
        self.relaxed: dict[str, Any] | None = None  # what the straggler rule did (for the report)
        self._plans: dict[int, RunPlan] = {}  # the broadcast decision: {replica, or -1 for all: plan}
        self._dp_log: list[tuple[float, float, float]] = []  # steady: (units end, all-reduce, tail) per iteration

    # --- one iteration ---------------------------------------------------------------------------
    def _step(self, data_iter: Iterator[Any], phase: str, extra: dict[str, Any] | None = None) -> StageTiming:
        engine = self.engine
        seen = len(_requested(self.clock))
        e0 = self.clock.energy_j() if self.clock is not None else None
        t0 = time.perf_counter()
        loss = engine.train_batch(data_iter)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        e1 = self.clock.energy_j() if self.clock is not None else None
        energy = e1 - e0 if e0 is not None and e1 is not None else None
        value = float(loss) if engine.is_last_stage() and loss is not None else None
        self.reporter.iteration(
            self._iteration, phase, t1 - t0, energy, _requested(self.clock)[seen:], engine.units, value, extra
        )
        self._iteration += 1
        h = engine.iteration_host_t0
        self.last_timing = StageTiming(
            engine.stage_id, t0, t1, [(u.kind, u.mb, h + u.start_s, h + u.end_s) for u in engine.units]
        )
        if phase == "steady" and engine.units:  # the tail as calibration measures it; the all-reduce within it
            units_end = max(u.end_s for u in engine.units)
            self._dp_log.append((units_end, engine.allreduce_s or 0.0, t1 - (h + units_end)))
        return self.last_timing

    def _gather(self, mine: Any) -> list[tuple[replicas.Place, Any]]:
        """Every rank's object with its place (stage, replica), in rank order (a collective call)."""
        return replicas.gather((self.place, mine))

    def _calibrate(
        self, orders: list[list[Unit]], iterations: list[list[tuple[replicas.Place, StageTiming]]]
    ) -> tuple[Calibration, list[tuple[replicas.Place, dict[str, float]]]]:
        """The job's calibration (per stage its slowest replica, its shortest tail) and per-rank numbers."""
        cals = replicas.calibrate_replicas(orders, iterations)
        entries = replicas.stage_entries(cals, iterations[-1])
        return replicas.job_calibration(cals, entries, len(orders)), entries

    def _unit_energy(self, timing: StageTiming) -> tuple[float | None, float | None, float | None]:
        """(mean F, mean B energy, idle power) of one iteration from the meter (counter at unit bounds)."""
        if self.meter is None or not timing.units or not self.meter.wait_until(timing.step_end):
            return None, None, None
        it = account(self.meter.trace, [(a, b) for _, _, a, b in timing.units], timing.step_start, timing.step_end)
        kinds = [k for k, *_ in timing.units]
        return it.mean(kinds, "F"), it.mean(kinds, "B"), it.idle_power_w

    # --- phases -----------------------------------------------------------------------------------
    def _idle_power(self) -> float:
        sim = self.clock if isinstance(self.clock, SimClock) else getattr(self.clock, "emulated", None)
        if sim is not None:
            return sim.model.idle_power_w
        if self.meter is None:
            raise ValueError("idle power needs an energy meter")
        t0 = time.perf_counter()
        time.sleep(0.5)
        t1 = time.perf_counter()
        self.meter.wait_until(t1)
        return float(self.meter.trace.between(t0, t1)) / (t1 - t0)

    def profile(self, data_iter: Iterator[Any], orders: list[list[Unit]]) -> Profile:
        """One 1F1B iteration at each of `profile_points` clocks: every stage's F/B time and energy
        (energy: the counter interpolated at unit boundaries)."""
        if self.clock is None or not self.clock.controls_clocks or self.meter is None:
            raise ValueError(
                "profiling clocks needs clock control (envpipe-clockd or the sim clock): give "
                "envpipe.profile or envpipe.plan, or use type 'baseline'"
            )
        clocks = profile_clocks(self.clock.supported_mhz, self.profile_points)
        self.idle_power_w = self._idle_power()
        P = self.engine.num_stages
        per_clock: list[list[replicas.Entry]] = []
        for mhz in clocks:
            self.engine.set_unit_orders(orders, [[mhz] * len(o) for o in orders], self.clock, timing=True)
            timing = self._step(data_iter, f"profile@{mhz}")
            gathered = self._gather((timing, self._unit_energy(timing)))
            its = [[(w, t) for w, (t, _) in gathered]]
            measured = replicas.stage_entries(replicas.calibrate_replicas(orders, its), its[-1])
            for (_, stats), (_, (_, (f_j, b_j, _))) in zip(measured, gathered, strict=True):
                stats.update(F_j=np.nan if f_j is None else f_j, B_j=np.nan if b_j is None else b_j)
            per_clock.append(list(measured))
        # every replica at every clock: a steadier sign of a straggler than the calibration iterations
        totals: dict[int, float] = {}
        for entries in per_clock:
            for replica, t in replicas.replica_times(entries).items():
                totals[replica] = totals.get(replica, 0.0) + t
        self.straggler = replicas.find_straggler(totals, self.cfg.straggler_threshold)
        if self.straggler is not None:
            fast = [replicas.slowest_per_stage(e, P, (self.straggler,)) for e in per_clock]
            self.fast_profile = _profile_of(clocks, fast, "online (replicas waiting for the straggler)")
        return _profile_of(clocks, [replicas.slowest_per_stage(e, P) for e in per_clock], "online")

    def plan(self, data_iter: Iterator[Any], cal: Calibration) -> tuple[RunPlan, Any]:
        """Profile where needed (every rank), decide on rank 0, broadcast: this replica's plan.

        The decision is a plan file; EnvPipe's own rule for 'baseline'; else the planner on the profile
        (online, or a profile file). Every replica of a stage gets the same plan, except that with
        `straggler: frontier` the replicas waiting for a straggler get the straggler rule's plan.
        Returns the plan and, when the planner made it, the planner's Plan, profile and idle power
        (to re-predict). A planning error on rank 0 is raised on every rank.
        """
        profile = None
        if not self.cfg.plan and not self.cfg.profile and self.cfg.type != "baseline":
            P, M = self.engine.num_stages, self.engine.micro_batches
            profile = self.profile(data_iter, one_f_one_b(P, M))  # collective: every rank profiles
        decided: Any = None
        if tdist.get_rank() == 0:
            try:
                decided = self._decide(profile, cal)
            except Exception as exc:  # every rank raises it, none waits for a plan that never comes
                decided = replicas.portable(exc)
        self._plans, self.relaxed, planned = replicas.agree(decided)
        return self._plans.get(self.place.replica, self._plans[-1]), planned

    def _decide(
        self, profile: Profile | None, cal: Calibration
    ) -> tuple[dict[int, RunPlan], dict[str, Any] | None, Any]:
        """({replica, or -1 for all: plan}, the straggler rule's note, the planner's output) on rank 0."""
        P, M = self.engine.num_stages, self.engine.micro_batches
        if self.cfg.plan:
            return {-1: load_plan(self.cfg.plan, P, M)}, None, None
        if self.cfg.type == "baseline" and not self.cfg.profile:
            plan = builtin_plan(self.cfg.scheduling, P, M, cal.fwd_s, cal.bwd_s)
            plan.predicted_time_s = predict_time(plan.orders, cal)
            return {-1: plan}, None, None
        if profile is None:
            assert self.cfg.profile is not None  # plan() profiles online otherwise
            profile = load_profile(self.cfg.profile)
        if profile.num_stages != P:
            raise ValueError(f"profile {profile.source} has {profile.num_stages} stages, the pipeline {P}")
        from envpipe.plan.planner import make_plan  # the planner is only needed for this phase

        idle_w = self.idle_power_w if self.idle_power_w is not None else self._idle_power()
        online = self._reconfigures()
        tail = np.asarray(cal.tail_s)
        result = make_plan(
            profile,
            M,
            schedule=self.cfg.scheduling,
            policy=self.cfg.type,
            reconfig="default" if online else self.cfg.reconfig,  # online: from measured waits instead
            idle_power_w=idle_w,
            gpu=self.cfg.gpu or "all",
            transfer_s=cal.transfer_s,
            tail_s=tail,
        )
        predicted = result.timeline  # simulated with the same transfer and tails (as is result.baseline)
        result.plan.save(Path(self.cfg.report_dir) / "plan.json")
        agreed = RunPlan.from_plan(result.plan, predicted, result.baseline)
        planned = (result.plan, profile, idle_w)
        plans = {-1: agreed}
        if self.straggler is None or self.cfg.straggler != "frontier":
            return plans, None, planned
        note: dict[str, Any] = {"straggler_replica": self.straggler, "applied": False}
        if self.fast_profile is None:
            note["reason"] = "the straggler rule needs online profiling (a profile per replica)"
            return plans, note, planned
        from envpipe.runtime.straggler import relaxed_plan

        relaxed = relaxed_plan(
            self.fast_profile, M, self.cfg.scheduling, idle_w, cal.tail_s, predicted.iteration_time, self.straggler,
            cal.transfer_s,
        )
        if relaxed is None:
            note["reason"] = "no frontier plan of the other replicas fits the straggler's time"
            return plans, note, planned
        for d in range(self.engine.grid.get_data_parallel_world_size()):
            if d != self.straggler:
                plans[d] = relaxed.plan
        return plans, {**relaxed.note, "applied": True}, planned

    def _reconfigures(self) -> bool:
        return self.cfg.reconfig != "default" and self.clock is not None and self.clock.controls_clocks

    def reconfigure(self, data_iter: Iterator[Any], plan: RunPlan, cal: Calibration, planned: Any) -> RunPlan:
        """EnvPipe's reconfiguration phase from measured waits; the plan's clocks come back raised."""
        if not self._reconfigures() or plan.clocks is None:
            return plan
        if self.relaxed and self.relaxed.get("applied"):  # every rank must take the same raises each round
            self.reconfig_log = {"method": self.cfg.reconfig, "skipped": "the straggler rule gave the replicas "
                                 "different plans; reconfiguration raises one plan's clocks on every replica"}
            return plan
        engine = self.engine
        idle_w = self.idle_power_w or 0.0
        rounds = 0

        def run_iteration(clocks: list[list[int]]) -> Any:
            nonlocal rounds
            engine.set_unit_orders(plan.orders, clocks, self.clock, timing=True)
            timing = self._step(data_iter, "reconfigure", {"round": rounds})
            rounds += 1
            gathered = self._gather(timing)  # the waits of the replica that ended last: all wait for it
            slowest = replicas.slowest_replica(gathered)
            stages = [t for w, t in gathered if w.replica == slowest]
            return measured_timeline(plan.orders, stages, cal, idle_power_w=idle_w)

        assert self.clock is not None
        done = reconfigure_online(
            self.cfg.reconfig, plan.orders, plan.clocks, self.clock.supported_mhz, run_iteration,
            self.reconfigure_rounds,
        )
        self.reconfig_log = {
            "method": self.cfg.reconfig,
            "rounds": len(done.rounds),
            "raises": done.result.raises,
            "stop_reason": done.result.stop_reason,
            "measured_time_s_per_round": [r.iteration_time_s for r in done.rounds],
            "critical_path_per_round": [[f"S{s}{k}{m}" for s, k, m in r.critical_path] for r in done.rounds],
        }
        plan.clocks = done.clocks
        if planned is not None and tdist.get_rank() == 0:  # re-predict the raised plan (only rank 0 reports it)
            from envpipe.plan.planfile import PlannedUnit, evaluate_plan
            from envpipe.profile.interpolate import with_clocks

            pl, profile, idle = planned
            profile = with_clocks(profile, {f for cs in done.clocks for f in cs})
            pl.stages = [
                [PlannedUnit(u.kind, u.mb, f) for u, f in zip(units, cs, strict=True)]
                for units, cs in zip(pl.stages, done.clocks, strict=True)
            ]
            raised = evaluate_plan(pl, profile, idle, cal.transfer_s, np.asarray(cal.tail_s))
            plan.predicted_time_s, plan.predicted_energy_j = raised.iteration_time, raised.energy
            pl.save(Path(self.cfg.report_dir) / "plan.json")
        return plan

    def train(
        self, data_iter: Iterator[Any], steps: int, calibration_steps: int = 2
    ) -> dict[str, Any] | None:
        engine = self.engine
        P, M = engine.num_stages, engine.micro_batches
        orders = one_f_one_b(P, M)
        engine.set_unit_orders(orders, clock=self.clock, timing=True)
        measured = [self._gather(self._step(data_iter, "calibrate")) for _ in range(max(1, calibration_steps))]
        cal, entries = self._calibrate(orders, measured[1:] or measured)  # the first iteration warms up
        self.calibration = cal
        self.straggler = replicas.find_straggler(replicas.replica_times(entries), self.cfg.straggler_threshold)
        plan, planned = self.plan(data_iter, cal)
        plan = self.reconfigure(data_iter, plan, cal, planned)
        engine.set_unit_orders(plan.orders, plan.clocks, self.clock, timing=True)
        if engine.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for i in range(steps):
            engine.time_units(i % STEADY_TIMED_EVERY == 0 or i == steps - 1)
            timing = self._step(data_iter, "steady")
            if timing.units:
                self._steady.append(timing)
            if len(self._steady) > STEADY_ACCOUNTED and i % STEADY_ACCOUNTED == 0:
                del self._steady[:-STEADY_ACCOUNTED]  # bounded memory and accounting time on long runs
                if self.meter is not None:
                    self.meter.trace.trim(self._steady[0].step_start)
        self.reporter.close()
        stage = self.reporter.stage
        stage.peak_memory_bytes = (
            torch.cuda.max_memory_allocated()
            if engine.device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )
        stage.unit_energy_j = self._steady_unit_energy()
        if self.meter is not None:
            self.meter.close()
        units_end, allreduce, tails = ([x[k] for x in self._dp_log] for k in range(3))
        digest = replicas.plan_digest(plan.orders, plan.clocks, engine.stage_id)
        everyone = replicas.gather(RankRecord(self.place, stage, digest, units_end, allreduce, tails))
        if tdist.get_rank() != 0:
            return None
        records = sorted(everyone, key=lambda r: (r.place.replica, r.place.stage))
        reports = [r.report for r in records]  # every GPU of every replica: job-wide energy
        dp = engine.grid.get_data_parallel_world_size()
        plans = [self._plans.get(d, self._plans[-1]) for d in range(dp)]
        baseline = {**plan.baseline, "energy_j": plan.baseline["energy_j"] * dp} if plan.baseline else None
        energies = [p.predicted_energy_j for p in plans]
        predicted_j = sum(e for e in energies if e is not None) if None not in energies else None
        predicted_s = plan.predicted_time_s  # with the straggler rule, the job waits for the straggler's plan
        if self.relaxed and self.relaxed.get("applied"):
            predicted_s = self.relaxed["straggler_predicted_time_s"]
        summary = summarize(reports, self.samples, self.reporter.energy_label, predicted_s, baseline)
        sim_tails = [max(0.0, t - cal.head_s) for t in cal.tail_s]  # the head folded into the tail taken out again
        summary["job"] = job_summary(
            records, self.reporter.energy_label, sim_tails, self.cfg.straggler_threshold, self.straggler
        )
        summary["job"]["straggler_rule"] = self.relaxed
        summary.update(
            type=self.cfg.type,
            scheduling=self.cfg.scheduling,
            reconfig=self.cfg.reconfig,
            stages=P,
            microbatches=M,
            plan_file=self.cfg.plan,
            baseline_source="planner prediction (simulated)" if plan.baseline else None,
            calibration=asdict(cal),
            predicted_energy_j=predicted_j,  # the job's: every replica's plan
            predicted_saving_vs_baseline=1.0 - predicted_j / baseline["energy_j"]
            if predicted_j is not None and baseline
            else None,
            reconfiguration=self.reconfig_log,
            energy_counter_update_s=self._counter_update_s(),
            orders=[[f"{k}{m}" for k, m in o] for o in plan.orders],
            clocks=plan.clocks,
        )
        write_summary(
            self.cfg.report_dir,
            summary,
            [r.report for r in records if r.place.replica == 0],  # the Gantt picture: one pipeline
            f"{self.cfg.scheduling} / {self.cfg.type}: measured units, energy {summary['energy']}",
        )
        return summary

    def _steady_unit_energy(self) -> dict[str, Any] | None:
        """Mean F/B unit energy and idle power over the steady iterations (counter at unit boundaries)."""
        if self.meter is None or not self._steady:
            return None
        per = [self._unit_energy(t) for t in self._steady]

        def mean(k: int) -> float | None:
            xs = [x for p in per if (x := p[k]) is not None]
            return float(np.mean(xs)) if xs else None
        return {"F_j": mean(0), "B_j": mean(1), "idle_w": mean(2), "energy": self.meter.label}

    def _counter_update_s(self) -> float | None:
        """Median seconds between the energy counter's updates seen by rank 0's meter (measured)."""
        if not isinstance(self.meter, PolledMeter):
            return None
        steps = self.meter.trace.update_intervals()
        return float(np.median(steps)) if steps.size else None


def _profile_of(clocks: list[int], rows: list[list[dict[str, float]]], source: str) -> Profile:
    """A Profile from per-clock, per-stage unit numbers (F, B seconds; F_j, B_j joules)."""

    def table(key: str) -> np.ndarray:
        return np.array([[rows[k][s][key] for k in range(len(clocks))] for s in range(len(rows[0]))], float)

    return Profile(np.array(clocks), table("F"), table("B"), table("F_j"), table("B_j"), source=source)

"""Phases of a run: calibrate (1F1B, measured unit/transfer/tail times), plan (a plan file, EnvPipe's
rule, or profile + the planner), reconfigure (from measured waits), steady state.

Every rank calls `train` with its EnvPipeEngine; rank 0 writes the summary and the Gantt picture.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from envpipe.energy.accounting import account
from envpipe.energy.meter import EnergyMeter, PolledMeter, SimMeter, nvml_reader
from envpipe.plan.schedules import Unit, one_f_one_b
from envpipe.profile import Profile, load_profile
from envpipe.runtime.clocks import Clock, SimClock, gpu_clock
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.engine import EnvPipeEngine
from envpipe.runtime.plans import RunPlan, builtin_plan, load_plan
from envpipe.runtime.reconfigure import reconfigure_online
from envpipe.runtime.report import Reporter, summarize, write_summary
from envpipe.runtime.timing import Calibration, StageTiming, calibrate, measured_timeline, predict_time

log = logging.getLogger(__name__)
STEADY_ACCOUNTED = 50  # unit energy in the summary: over the last (up to) this many steady iterations


def make_clock(cfg: EnvPipeConfig, engine: EnvPipeEngine) -> Clock | None:
    on_gpu = engine.device.type == "cuda"
    kind = ("daemon" if on_gpu else "sim") if cfg.clock == "auto" else cfg.clock
    if kind == "sim":
        if on_gpu:  # the sim clock stretches wall time between units, which GPU timing does not see
            raise ValueError(
                "envpipe.clock 'sim' emulates clocks on CPU only; use 'daemon' or 'auto' on GPUs"
            )
        return SimClock()
    if kind == "daemon":
        if not on_gpu:
            raise ValueError("envpipe.clock 'daemon' needs a GPU; use 'sim' or 'auto' on CPU")
        return gpu_clock(engine.device.index or 0)
    return None


def make_meter(clock: Clock | None, engine: EnvPipeEngine) -> EnergyMeter | None:
    """The simulated GPU's exact counter, or this GPU's NVML counter polled in the background."""
    if isinstance(clock, SimClock):
        return SimMeter(clock.trace, clock.energy_j)
    if clock is None or engine.device.type != "cuda":
        return None
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
        self._round = 0
        self.reconfig_log: dict[str, Any] | None = None
        self.calibration: Calibration | None = None

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
        return self.last_timing

    def _gather(self, mine: Any) -> list[Any]:
        """This rank's object from every stage, in stage order (any data-parallel replica will do)."""
        everyone: list[Any] = [None] * tdist.get_world_size()
        tdist.all_gather_object(everyone, (self.engine.stage_id, mine))
        per_stage = dict(everyone)
        return [per_stage[s] for s in range(self.engine.num_stages)]

    def _unit_energy(self, timing: StageTiming) -> tuple[float | None, float | None, float | None]:
        """(mean F, mean B energy, idle power) of one iteration from the meter (counter at unit bounds)."""
        if self.meter is None or not timing.units or not self.meter.wait_until(timing.step_end):
            return None, None, None
        it = account(self.meter.trace, [(a, b) for _, _, a, b in timing.units], timing.step_start, timing.step_end)
        kinds = [k for k, *_ in timing.units]
        return it.mean(kinds, "F"), it.mean(kinds, "B"), it.idle_power_w

    # --- phases -----------------------------------------------------------------------------------
    def _idle_power(self) -> float:
        if isinstance(self.clock, SimClock):
            return self.clock.model.idle_power_w
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
        times, energies = [], []
        for mhz in clocks:
            self.engine.set_unit_orders(orders, [[mhz] * len(o) for o in orders], self.clock, timing=True)
            timing = self._step(data_iter, f"profile@{mhz}")
            stages = self._gather((timing, self._unit_energy(timing)))
            cal = calibrate(orders, [[t for t, _ in stages]])
            times.append((cal.fwd_s, cal.bwd_s))
            energies.append([e[:2] for _, e in stages])

        fwd_t, bwd_t = (np.array([[t[kind][s] for t in times] for s in range(P)], float) for kind in (0, 1))
        fwd_j, bwd_j = (np.array([[e[s][kind] for e in energies] for s in range(P)], float) for kind in (0, 1))
        return Profile(np.array(clocks), fwd_t, bwd_t, fwd_j, bwd_j, source="online")

    def plan(self, data_iter: Iterator[Any], cal: Calibration) -> tuple[RunPlan, Any]:
        """A plan file; EnvPipe's own rule for 'baseline'; else profile (or a profile file) and plan.

        Returns the plan and, when the planner made it, the planner's Plan and profile (to re-predict).
        """
        P, M = self.engine.num_stages, self.engine.micro_batches
        if self.cfg.plan:
            return load_plan(self.cfg.plan, P, M), None
        if self.cfg.type == "baseline" and not self.cfg.profile:
            plan = builtin_plan(self.cfg.scheduling, P, M, cal.fwd_s, cal.bwd_s)
            plan.predicted_time_s = predict_time(plan.orders, cal)
            return plan, None
        orders = one_f_one_b(P, M)
        profile = load_profile(self.cfg.profile) if self.cfg.profile else self.profile(data_iter, orders)
        if profile.num_stages != P:
            raise ValueError(f"profile {profile.source} has {profile.num_stages} stages, the pipeline {P}")
        from envpipe.plan.planfile import baseline_timeline, evaluate_plan
        from envpipe.plan.planner import make_plan  # the planner is only needed for this phase

        idle_w = self.idle_power_w if self.idle_power_w is not None else self._idle_power()
        online = self._reconfigures()
        result = make_plan(
            profile,
            M,
            schedule=self.cfg.scheduling,
            policy=self.cfg.type,
            reconfig="default" if online else self.cfg.reconfig,  # online: from measured waits instead
            idle_power_w=idle_w,
            gpu=self.cfg.gpu or "all",
            transfer_s=cal.transfer_s,
        )
        tail = np.asarray(cal.tail_s)
        predicted = evaluate_plan(result.plan, profile, idle_w, cal.transfer_s, tail)
        baseline = baseline_timeline(profile, M, idle_w, cal.transfer_s, tail)
        if tdist.get_rank() == 0:
            result.plan.save(Path(self.cfg.report_dir) / "plan.json")
        run = RunPlan(
            result.plan.orders(),
            [[u.freq_mhz for u in units] for units in result.plan.stages],
            predicted.iteration_time,
            {"time_s": baseline.iteration_time, "energy_j": baseline.energy},
            predicted.energy,
        )
        return run, (result.plan, profile, idle_w)

    def _reconfigures(self) -> bool:
        return self.cfg.reconfig != "default" and self.clock is not None and self.clock.controls_clocks

    def reconfigure(self, data_iter: Iterator[Any], plan: RunPlan, cal: Calibration, planned: Any) -> RunPlan:
        """EnvPipe's reconfiguration phase from measured waits; the plan's clocks come back raised."""
        if not self._reconfigures() or plan.clocks is None:
            return plan
        engine = self.engine
        idle_w = self.idle_power_w or 0.0

        def run_iteration(clocks: list[list[int]]) -> Any:
            engine.set_unit_orders(plan.orders, clocks, self.clock, timing=True)
            timing = self._step(data_iter, "reconfigure", {"round": self._round})
            self._round += 1
            return measured_timeline(plan.orders, self._gather(timing), cal, idle_power_w=idle_w)

        self._round = 0
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
        if planned is not None:  # re-predict the raised plan with the planner's simulator
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
            if tdist.get_rank() == 0:
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
        cal = calibrate(orders, measured[1:] or measured)  # the first iteration warms up
        self.calibration = cal
        plan, planned = self.plan(data_iter, cal)
        plan = self.reconfigure(data_iter, plan, cal, planned)
        engine.set_unit_orders(plan.orders, plan.clocks, self.clock, timing=True)
        if engine.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for i in range(steps):
            self._steady.append(self._step(data_iter, "steady"))
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
        everyone: list[Any] = [None] * tdist.get_world_size()
        tdist.all_gather_object(everyone, stage)
        if tdist.get_rank() != 0:
            return None
        reports = sorted({s.stage: s for s in everyone}.values(), key=lambda s: s.stage)
        summary = summarize(
            reports, self.samples, self.reporter.energy_label, plan.predicted_time_s, plan.baseline
        )
        summary.update(
            type=self.cfg.type,
            scheduling=self.cfg.scheduling,
            reconfig=self.cfg.reconfig,
            stages=P,
            microbatches=M,
            plan_file=self.cfg.plan,
            baseline_source="planner prediction (simulated)" if plan.baseline else None,
            calibration=cal.as_dict(),
            predicted_energy_j=plan.predicted_energy_j,
            predicted_saving_vs_baseline=1.0 - plan.predicted_energy_j / plan.baseline["energy_j"]
            if plan.predicted_energy_j is not None and plan.baseline
            else None,
            reconfiguration=self.reconfig_log,
            energy_counter_update_s=self._counter_update_s(),
            orders=[[f"{k}{m}" for k, m in o] for o in plan.orders],
            clocks=plan.clocks,
        )
        write_summary(
            self.cfg.report_dir,
            summary,
            reports,
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

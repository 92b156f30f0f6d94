"""Phases of a run: calibrate (1F1B, measured unit times), plan (plan file or EnvPipe's rule), steady state.

Every rank calls `train` with its EnvPipeEngine; rank 0 writes the summary and the Gantt picture.
"""

from __future__ import annotations

import logging
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from envpipe.plan.schedules import one_f_one_b
from envpipe.profile import Profile, load_profile
from envpipe.runtime import replicas
from envpipe.runtime.clocks import Clock, SimClock, gpu_clock
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.engine import EnvPipeEngine
from envpipe.runtime.jobreport import RankRecord, job_summary
from envpipe.runtime.plans import RunPlan, builtin_plan, load_plan
from envpipe.runtime.report import Reporter, summarize, write_summary
from envpipe.runtime.schedule import simulate_orders

log = logging.getLogger(__name__)


def make_clock(cfg: EnvPipeConfig, engine: EnvPipeEngine) -> Clock | None:
    on_gpu = engine.device.type == "cuda"
    kind = ("daemon" if on_gpu else "sim") if cfg.clock == "auto" else cfg.clock
    if kind == "sim":
        if on_gpu:  # the sim clock stretches wall time between units, which GPU timing does not see
            raise ValueError(
                "envpipe.clock 'sim' emulates clocks on CPU only; use 'daemon' or 'auto' on GPUs"
            )
        return SimClock(slowdown=replicas.sim_slowdown(engine.grid.get_data_parallel_id()))
    if kind == "daemon":
        if not on_gpu:
            raise ValueError("envpipe.clock 'daemon' needs a GPU; use 'sim' or 'auto' on CPU")
        return gpu_clock(engine.device.index or 0)
    return None


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
    ):
        self.engine, self.cfg, self.clock = engine, cfg, clock
        self.samples = samples_per_iteration
        label = clock.energy_label if clock is not None else "none"
        self.reporter = Reporter(cfg.report_dir, tdist.get_rank(), engine.stage_id, label)
        self._iteration = 0
        self.profile_points = profile_points
        self.idle_power_w: float | None = None
        self.place = replicas.place(engine)
        self.tails_s = [0.0] * engine.num_stages  # measured per-stage tail, used in predictions
        self.straggler: int | None = None  # a straggling replica (calibration, then profiling iterations)
        self.fast_profile: Profile | None = None  # the other replicas' profile when there is a straggler
        self.relaxed: dict[str, Any] | None = None  # what the straggler rule did (for the report)
        self._entries: list[replicas.Entry] = []
        self._dp_log: list[tuple[float, float, float]] = []  # steady: (pipeline end, all-reduce, tail)

    def _step(self, data_iter: Iterator[Any], phase: str) -> tuple[float, float | None]:
        seen = len(_requested(self.clock))
        e0 = self.clock.energy_j() if self.clock is not None else None
        t0 = time.perf_counter()
        loss = self.engine.train_batch(data_iter)
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter() - t0
        e1 = self.clock.energy_j() if self.clock is not None else None
        energy = e1 - e0 if e0 is not None and e1 is not None else None
        value = float(loss) if self.engine.is_last_stage() and loss is not None else None
        self.reporter.iteration(
            self._iteration, phase, t, energy, _requested(self.clock)[seen:], self.engine.units, value
        )
        self._iteration += 1
        if phase == "steady":
            tail = self.engine.tail
            end = max((u.end_s for u in self.engine.units), default=0.0)
            self._dp_log.append((end, tail.allreduce_s, tail.tail_s) if tail else (end, 0.0, 0.0))
        return t, energy

    def _gather_stages(self, mine: dict[str, float]) -> list[dict[str, float]]:
        """Every rank's numbers; per stage those of its slowest replica (envpipe.runtime.replicas)."""
        self._entries = replicas.gather((self.place, mine))
        return replicas.slowest_per_stage(self._entries, self.engine.num_stages)

    def _unit_stats(self, t: float, energy: float | None, idle_w: float) -> dict[str, float]:
        """Mean F/B time of the last iteration and, from the energy counter, F/B energy.

        The counter is read at iteration boundaries; the energy above idle power for the waits is
        spread over the units in proportion to their time (linear interpolation at unit boundaries).
        """
        units = self.engine.units
        stats = {k: statistics.mean(u.end_s - u.start_s for u in units if u.kind == k) for k in "FB"}
        busy = sum(u.end_s - u.start_s for u in units)
        busy_w = ((energy or 0.0) - idle_w * max(0.0, t - busy)) / busy
        stats.update(F_j=stats["F"] * busy_w, B_j=stats["B"] * busy_w)
        tail = self.engine.tail
        stats.update(
            pipeline_s=max(u.end_s for u in units),
            allreduce_s=tail.allreduce_s if tail else 0.0,
            tail_s=tail.tail_s if tail else 0.0,
        )
        return stats

    def _idle_power(self) -> float:
        if isinstance(self.clock, SimClock):
            return self.clock.model.idle_power_w
        assert self.clock is not None
        e0, t0 = self.clock.energy_j(), time.perf_counter()
        time.sleep(0.5)
        return ((self.clock.energy_j() or 0.0) - (e0 or 0.0)) / (time.perf_counter() - t0)

    def profile(self, data_iter: Iterator[Any]) -> Profile:
        """Run one 1F1B iteration at each of `profile_points` clocks and measure every stage's units."""
        if self.clock is None or not self.clock.controls_clocks:
            raise ValueError(
                "profiling clocks needs clock control (envpipe-clockd or the sim clock): give "
                "envpipe.profile or envpipe.plan, or use type 'baseline'"
            )
        clocks = profile_clocks(self.clock.supported_mhz, self.profile_points)
        idle_w = self._idle_power()
        P, M = self.engine.num_stages, self.engine.micro_batches
        orders = one_f_one_b(P, M)
        rows, per_clock = [], []
        for mhz in clocks:
            self.engine.set_unit_orders(orders, [[mhz] * len(o) for o in orders], self.clock, timing=True)
            t, energy = self._step(data_iter, f"profile@{mhz}")
            rows.append(self._gather_stages(self._unit_stats(t, energy, idle_w)))
            per_clock.append(self._entries)
        self.idle_power_w = idle_w
        # every replica at every clock: a steadier sign of a straggler than the calibration iterations
        totals: dict[int, float] = {}
        for entries in per_clock:
            for replica, t in replicas.replica_times(entries).items():
                totals[replica] = totals.get(replica, 0.0) + t
        self.straggler = replicas.find_straggler(totals, self.cfg.straggler_threshold)
        if self.straggler is not None:
            fast = [replicas.slowest_per_stage(e, P, (self.straggler,)) for e in per_clock]
            self.fast_profile = _profile_of(clocks, fast, "online (replicas waiting for the straggler)")
        return _profile_of(clocks, rows, "online")

    def plan(self, data_iter: Iterator[Any], fwd_s: list[float], bwd_s: list[float]) -> RunPlan:
        """Profile where needed (every rank), decide on rank 0, broadcast: this replica's plan.

        The decision is a plan file; EnvPipe's own rule for 'baseline'; else the planner on the profile
        (online or a file). Every replica of a stage gets the same plan, except that with
        `straggler: frontier` the replicas waiting for a straggler get the straggler rule's plan.
        """
        profile = None
        if not self.cfg.plan and not (self.cfg.type == "baseline" and not self.cfg.profile):
            profile = load_profile(self.cfg.profile) if self.cfg.profile else self.profile(data_iter)
        decided: Any = None
        if tdist.get_rank() == 0:
            try:
                decided = self._decide(profile, fwd_s, bwd_s)
            except Exception as exc:  # every rank raises it, none waits for a plan that never comes
                decided = replicas.portable(exc)
        plans, self.relaxed = replicas.agree(decided)
        return plans.get(self.place.replica, plans[-1])

    def _decide(
        self, profile: Profile | None, fwd_s: list[float], bwd_s: list[float]
    ) -> tuple[dict[int, RunPlan], dict[str, Any] | None]:
        """{replica or -1 for all: plan}, and the straggler rule's note (rank 0 only)."""
        P, M = self.engine.num_stages, self.engine.micro_batches
        if self.cfg.plan:
            return {-1: load_plan(self.cfg.plan, P, M)}, None
        if profile is None:
            plan = builtin_plan(self.cfg.scheduling, P, M, fwd_s, bwd_s)
            times = simulate_orders(plan.orders, lambda s, k: fwd_s[s] if k == "F" else bwd_s[s])
            plan.predicted_time_s = max(st[-1][1] + tail for st, tail in zip(times, self.tails_s, strict=True))
            return {-1: plan}, None
        if profile.num_stages != P:
            raise ValueError(f"profile {profile.source} has {profile.num_stages} stages, the pipeline {P}")
        from envpipe.plan.planner import make_plan  # the planner is only needed for this phase

        idle_w = self.idle_power_w if self.idle_power_w is not None else self._idle_power()
        result = make_plan(
            profile,
            M,
            schedule=self.cfg.scheduling,
            policy=self.cfg.type,
            reconfig=self.cfg.reconfig,
            idle_power_w=idle_w,
            gpu=self.cfg.gpu or "all",
            tail_s=self.tails_s,
        )
        result.plan.save(Path(self.cfg.report_dir) / "plan.json")
        pred = result.plan.predicted
        agreed = RunPlan(
            result.plan.orders(),
            [[u.freq_mhz for u in units] for units in result.plan.stages],
            pred.get("iteration_time_s"),
            {"time_s": pred["baseline_time_s"], "energy_j": pred["baseline_energy_j"]}
            if "baseline_time_s" in pred and "baseline_energy_j" in pred
            else None,
        )
        plans = {-1: agreed}
        if self.straggler is None or self.cfg.straggler != "frontier":
            return plans, None
        if self.fast_profile is None:
            return plans, {"straggler_replica": self.straggler, "applied": False,
                           "reason": "the straggler rule needs online profiling (a profile per replica)"}
        from envpipe.runtime.straggler import relaxed_plan

        relaxed = relaxed_plan(
            self.fast_profile,
            M,
            self.cfg.scheduling,
            idle_w,
            self.tails_s,
            agreed.predicted_time_s or 0.0,
            self.straggler,
        )
        if relaxed is None:
            return plans, {"straggler_replica": self.straggler, "applied": False,
                           "reason": "no frontier plan of the other replicas fits the straggler's time"}
        for d in range(self.engine.grid.get_data_parallel_world_size()):
            if d != self.straggler:
                plans[d] = relaxed.plan
        return plans, {**relaxed.note, "applied": True}

    def train(
        self, data_iter: Iterator[Any], steps: int, calibration_steps: int = 2
    ) -> dict[str, Any] | None:
        engine = self.engine
        engine.set_unit_orders(
            one_f_one_b(engine.num_stages, engine.micro_batches), clock=self.clock, timing=True
        )
        last: tuple[float, float | None] = (0.0, None)
        for _ in range(max(1, calibration_steps)):
            last = self._step(data_iter, "calibrate")
        stages = self._gather_stages(self._unit_stats(last[0], last[1], 0.0))
        self.tails_s = replicas.stage_tails(self._entries, engine.num_stages)
        self.straggler = replicas.find_straggler(
            replicas.replica_times(self._entries), self.cfg.straggler_threshold
        )
        plan = self.plan(data_iter, [st["F"] for st in stages], [st["B"] for st in stages])
        engine.set_unit_orders(plan.orders, plan.clocks, self.clock, timing=True)
        if engine.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(steps):
            self._step(data_iter, "steady")
        self.reporter.close()
        stage = self.reporter.stage
        stage.peak_memory_bytes = (
            torch.cuda.max_memory_allocated()
            if engine.device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )
        pipes, reduces, tails = (list(x) for x in zip(*self._dp_log, strict=True)) if self._dp_log else ([], [], [])
        digest = replicas.plan_digest(plan.orders, plan.clocks, engine.stage_id)
        everyone = replicas.gather(RankRecord(self.place, stage, digest, pipes, reduces, tails))
        if tdist.get_rank() != 0:
            return None
        records = sorted(everyone, key=lambda r: (r.place.replica, r.place.stage))
        reports = [r.report for r in records]  # every GPU of every replica: job-wide energy
        dp = len({r.place.replica for r in records})
        baseline = {**plan.baseline, "energy_j": plan.baseline["energy_j"] * dp} if plan.baseline else None
        predicted = plan.predicted_time_s  # with the straggler rule, the job waits for the straggler's plan
        if self.relaxed and self.relaxed.get("applied"):
            predicted = self.relaxed["straggler_predicted_time_s"]
        summary = summarize(reports, self.samples, self.reporter.energy_label, predicted, baseline)
        summary["job"] = job_summary(
            records, self.reporter.energy_label, self.tails_s, self.cfg.straggler_threshold, self.straggler
        )
        summary["job"]["straggler_rule"] = self.relaxed
        summary.update(
            type=self.cfg.type,
            scheduling=self.cfg.scheduling,
            stages=engine.num_stages,
            microbatches=engine.micro_batches,
            plan_file=self.cfg.plan,
            baseline_source="planner prediction (simulated)" if plan.baseline else None,
            orders=[[f"{k}{m}" for k, m in o] for o in plan.orders],
        )
        write_summary(
            self.cfg.report_dir,
            summary,
            [r.report for r in records if r.place.replica == 0],
            f"{self.cfg.scheduling} / {self.cfg.type}: measured units, energy {summary['energy']}",
        )
        return summary


def _profile_of(clocks: list[int], rows: list[list[dict[str, float]]], source: str) -> Profile:
    """A Profile from per-clock, per-stage unit numbers."""

    def table(key: str) -> np.ndarray:
        return np.array([[rows[k][s][key] for k in range(len(clocks))] for s in range(len(rows[0]))])

    return Profile(np.array(clocks), table("F"), table("B"), table("F_j"), table("B_j"), source=source)

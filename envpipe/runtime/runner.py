"""Phases of a run: calibrate (1F1B, measured unit times), plan (plan file or EnvPipe's rule), steady state.

Every rank calls `train` with its EnvPipeEngine; rank 0 writes the summary and the Gantt picture.
"""

from __future__ import annotations

import logging
import resource
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as tdist

from envpipe.runtime.clocks import Clock, SimClock, gpu_clock
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.engine import EnvPipeEngine
from envpipe.runtime.plans import RunPlan, builtin_plan, load_plan
from envpipe.runtime.report import Reporter, summarize, write_summary
from envpipe.runtime.schedule import one_f_one_b, simulate_orders

log = logging.getLogger(__name__)


def make_clock(cfg: EnvPipeConfig, engine: EnvPipeEngine) -> Clock | None:
    if cfg.clock == "sim":
        return SimClock()
    if cfg.clock == "daemon":
        if engine.device.type != "cuda":
            raise ValueError("envpipe.clock 'daemon' needs a GPU; use 'sim' on CPU")
        return gpu_clock(engine.device.index or 0)
    return None


def _requested(clock: Clock | None) -> list[int]:
    return list(getattr(clock, "requested", []))


class Runner:
    def __init__(
        self, engine: EnvPipeEngine, cfg: EnvPipeConfig, clock: Clock | None, samples_per_iteration: int
    ):
        self.engine, self.cfg, self.clock = engine, cfg, clock
        self.samples = samples_per_iteration
        label = clock.energy_label if clock is not None else "none"
        self.reporter = Reporter(cfg.report_dir, tdist.get_rank(), engine.stage_id, label)
        self._iteration = 0

    def _step(self, data_iter: Iterator[Any], phase: str) -> None:
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

    def _unit_means(self) -> tuple[list[float], list[float]]:
        """Per-stage mean forward/backward time of the last iteration, from every rank."""
        mine = {
            k: statistics.mean(u.end_s - u.start_s for u in self.engine.units if u.kind == k) for k in "FB"
        }
        everyone: list[Any] = [None] * tdist.get_world_size()
        tdist.all_gather_object(everyone, (self.engine.stage_id, mine))
        per_stage = dict(everyone)  # data-parallel replicas of a stage: any one will do
        P = self.engine.num_stages
        return [per_stage[s]["F"] for s in range(P)], [per_stage[s]["B"] for s in range(P)]

    def plan(self, fwd_s: list[float], bwd_s: list[float]) -> RunPlan:
        P, M = self.engine.num_stages, self.engine.micro_batches
        if self.cfg.plan:
            return load_plan(self.cfg.plan, P, M)
        if self.cfg.type != "baseline":
            raise ValueError(
                f"envpipe.type {self.cfg.type!r} needs a plan file (envpipe.plan): online planning "
                "is not available in this runtime yet; use type 'baseline' to run without one"
            )
        plan = builtin_plan(self.cfg.scheduling, P, M, fwd_s, bwd_s)
        times = simulate_orders(plan.orders, lambda s, k: fwd_s[s] if k == "F" else bwd_s[s])
        plan.predicted_time_s = max(end for st in times for _, end in st)
        return plan

    def train(
        self, data_iter: Iterator[Any], steps: int, calibration_steps: int = 2
    ) -> dict[str, Any] | None:
        engine = self.engine
        engine.set_unit_orders(
            one_f_one_b(engine.num_stages, engine.micro_batches), clock=self.clock, timing=True
        )
        for _ in range(max(1, calibration_steps)):
            self._step(data_iter, "calibrate")
        plan = self.plan(*self._unit_means())
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
        everyone: list[Any] = [None] * tdist.get_world_size()
        tdist.all_gather_object(everyone, stage)
        if tdist.get_rank() != 0:
            return None
        stages = sorted({s.stage: s for s in everyone}.values(), key=lambda s: s.stage)
        summary = summarize(
            stages, self.samples, self.reporter.energy_label, plan.predicted_time_s, plan.baseline
        )
        summary.update(
            type=self.cfg.type,
            scheduling=self.cfg.scheduling,
            stages=engine.num_stages,
            microbatches=engine.micro_batches,
            plan_file=self.cfg.plan,
            orders=[[f"{k}{m}" for k, m in o] for o in plan.orders],
        )
        write_summary(
            self.cfg.report_dir,
            summary,
            stages,
            f"{self.cfg.scheduling} / {self.cfg.type}: measured units, energy {summary['energy']}",
        )
        return summary

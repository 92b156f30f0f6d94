"""What the phases work on: one rank's view of the job, and the iteration requests they make.

The user's script owns the training loop: every `engine.train_batch()` call runs one iteration. So the
phases (calibrate, profile, reconfigure, steady) are generators: each *yields* a `Step` (which plan to run
next, in which phase) and gets back, at the next `train_batch()`, what that iteration measured on this rank
(`Measured`). Between two yields they may plan, gather and agree (collectives): every rank runs the same
phases over the same number of `train_batch()` calls, so the collectives meet.

`Rig` holds what the phases need besides the iteration itself: the job's shape, this rank's place, the
clock and its energy meter, the 1F1B all-max baseline plan and the job's collectives. It never runs an
iteration and knows nothing of the phases (no cycle: envpipe.runtime.run owns it and drives them).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed

from envpipe.energy.accounting import account
from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime.clocks import Clock, make_meter, simulated_gpu
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.measure import collective
from envpipe.runtime.measure.memory import device_limit, peak_bytes, static_bytes
from envpipe.runtime.measure.timing import StageTiming

T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One iteration a phase asks for."""

    plan: Plan  # orders, and clocks where they can be set
    phase: str  # calibrate, profile@MHz, reconfigure, steady
    runs: str  # envpipe.runtime.measure.iterations.PLAN or BASELINE (1F1B, every clock at max)
    timed: bool = True  # time every unit (CUDA events and one synchronize on GPUs)
    measure_memory: bool = False  # meter the bytes each forward keeps for its backward
    extra: Mapping[str, Any] = field(default_factory=dict)  # more fields for the iteration's JSON line
    stretch: Sequence[float] | None = None  # this rank's delay per unit of its stage's order (a rehearsal)


@dataclass(frozen=True)
class Measured:
    """What one iteration of a `Step` gave this rank."""

    timing: StageTiming
    loss: float | None
    saved_bytes: list[int] | None  # per forward unit, when the step asked for it
    allreduce_s: float | None  # the gradient all-reduce (ReduceTiedGrads + ReduceGrads), when units were timed
    stretched: tuple[float, float] | None = None  # a rehearsed iteration's delays: (asked, inserted) seconds


Phase = Generator[Step, Measured, T]  # a phase: yields steps, receives their measurements, returns its result


@dataclass(frozen=True)
class EnergySplit:
    """One iteration of one rank, split by what the GPU did (J and s; None without an energy counter)."""

    fwd_j: float | None  # mean forward unit
    bwd_j: float | None
    units_j: float  # every unit
    wait_j: float  # between the iteration's start and its last unit, outside units: blocked on a neighbour
    wait_s: float
    tail_j: float  # after the last unit: gradient all-reduce, optimizer step
    tail_s: float

    def charging_waits_at(self, power_w: float) -> EnergySplit:
        """This split with its waits charged at ``power_w`` (measured over a window the counter resolves) and
        the difference moved to the work, units and tail in proportion; the iteration's total stays as measured.

        Why: NVML's counter moves every 100 ms on H100 and H200, and a bubble lasts a few ms, so the
        interpolated counter charges a bubble at about the iteration's mean power (330-536 W on 2 x H100, where a
        longer iteration cost a median 69-306 W more per extra second: benchmarks/results/dropin_h100x2.md), and
        the units too little."""
        work = self.units_j + self.tail_j
        if work <= 0:
            return self
        k = max(0.0, (work + self.wait_j - power_w * self.wait_s) / work)
        scaled = lambda j: None if j is None else j * k  # noqa: E731
        return EnergySplit(scaled(self.fwd_j), scaled(self.bwd_j), self.units_j * k, power_w * self.wait_s,
                           self.wait_s, self.tail_j * k, self.tail_s)

    @staticmethod
    def unit_means(split: EnergySplit | None) -> tuple[float | None, float | None] | None:
        """(mean forward, mean backward) unit energy of an iteration, None without a meter."""
        return None if split is None else (split.fwd_j, split.bwd_j)


class Rig:
    def __init__(self, engine: Any, cfg: EnvPipeConfig, clock: Clock | None) -> None:
        self._engine = engine
        self.cfg, self.clock = cfg, clock
        self.P, self.M = engine.num_stages, engine.micro_batches
        self.dp = engine.grid.get_data_parallel_world_size()
        self.place = collective.place(engine)
        self.controls = clock is not None and clock.controls_clocks
        self.meter = make_meter(clock)
        self.sim = simulated_gpu(clock)  # CPU: times are the simulated GPU's virtual time
        self.f_max = clock.supported_mhz[0] if clock is not None else 0
        self.baseline = Plan.at_one_clock(one_f_one_b(self.P, self.M), self.f_max, "1f1b", "baseline")
        self.samples_per_iteration = engine.train_batch_size()

    def has_run(self, plan: Plan) -> bool:
        """``plan``'s order ran an iteration in this process (a new one warms up before it is compared)."""
        return bool(self._engine.has_run(plan.orders()))

    @property
    def on_gpu(self) -> bool:
        return bool(self._engine.device.type == "cuda")

    def gather(self, mine: Any) -> list[tuple[collective.Place, Any]]:
        """Every rank's object with its place (stage, replica), in rank order (a collective call)."""
        return collective.gather((self.place, mine))

    def gather_each(self, mine: Sequence[T]) -> list[list[tuple[collective.Place, T]]]:
        """Every rank's object of each of several iterations, per iteration, in one collective call after the
        last of them: the iterations ran back to back, as steady ones do."""
        everyone = self.gather(list(mine))
        return [[(w, theirs[i]) for w, theirs in everyone] for i in range(len(mine))]

    def edge(self) -> float:
        """When an iteration starts or ends: host time, or a simulated GPU's virtual time, which every rank
        then agrees on (the job's collectives make every GPU wait for the last one)."""
        if self.sim is None:
            return time.perf_counter()
        self.sim.sync(collective.job_max(self.sim.now()))
        return self.sim.now()

    def energy(self, timing: StageTiming, wait_power_w: float | None = None) -> EnergySplit | None:
        """This rank's energy in ``timing``'s iteration, split into units, waits and tail, the waits charged at
        ``wait_power_w`` where given (`EnergySplit.charging_waits_at`); None without a meter or timed units (a
        collective-free call: the meter is local)."""
        if self.meter is None or not timing.units or not self.meter.wait_until(timing.step_end):
            return None
        last_end = max(b for *_, b in timing.units)
        units = account(self.meter.trace, [(a, b) for _, _, a, b in timing.units], timing.step_start, last_end)
        kinds = [k for k, *_ in timing.units]
        tail_j = float(self.meter.trace.between(last_end, timing.step_end))
        split = EnergySplit(units.mean(kinds, "F"), units.mean(kinds, "B"), sum(units.unit_j), units.idle_j,
                            units.idle_s, tail_j, timing.step_end - last_end)
        return split if wait_power_w is None else split.charging_waits_at(wait_power_w)

    def wait_in_collective(self) -> None:
        """Wait on this rank's device in one all-reduce over the job until every rank has joined (a collective
        call): on a GPU an NCCL kernel spins the way a pipeline bubble's receive does."""
        token = torch.zeros(1, device=self._engine.device)
        torch.distributed.all_reduce(token)
        if self.on_gpu:
            torch.cuda.synchronize()

    def static_bytes(self) -> int:
        """What the stage holds between iterations (parameters, gradients, optimizer state)."""
        return static_bytes(self._engine)

    def peak_bytes(self) -> int | None:
        """The allocator's peak so far (GPUs; None on CPU)."""
        return peak_bytes(self._engine)

    def memory_limit(self) -> int | None:
        return device_limit(self._engine, self.cfg.memory_limit_bytes)

"""The simulated GPU's hidden ground truth, and the oracle that reads it.

The truth is a real clock-swept measurement: one Perseus profile (per stage, the forward and backward unit's
time and energy at every SM clock of a real GPU; envpipe/profile/data). A job's unit takes its own work
(`envpipe.simgpu.cost`: its FLOPs at the nominal rate = its seconds at the highest clock) and the table's
curves: at clock f it lasts ``work x T(f) / T(top)`` and draws the table's power ``E(f) / T(f)`` (watts
of the real GPU). So the simulated GPU slows down, saturates under its power cap and draws power exactly
as the measured one did, including the table's own measurement bumps, while the job's units keep their
own lengths.

Stage mapping: the job's stage s of P runs the table's stage ``round(s (S - 1) / (P - 1))`` of S; so the
first stage is the table's first and the last stage the table's last (the one with the output layer and
the loss in Perseus's pipelines), the ones between spread evenly. A one-stage job (it holds the output
layer) runs the table's last stage.

Blocking power (a GPU waiting on its neighbour): what Perseus measured for that GPU around a blocked
``dist.recv`` (envpipe.profile.gpus.IDLE_POWER_W). Tail (all-reduce, optimizer step: memory- and link-bound,
so their length does not depend on the clock): blocking power plus half the stage's backward power above
it at the current clock; on an H100 a device-to-device copy loop drew 398 W against 120 W idle and 685 W
for dense GEMMs (2026-11-24, /work/shared/data/measured): (398 - 120) / (685 - 120) = 0.49.

Nothing in envpipe.plan or envpipe.profile imports this package: the planner only learns the truth by
profiling the simulated GPU, as it would a real one. The oracle (`JobTruth.oracle_profile`) is for the
report: the saving a planner with the whole noise-free table would have found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from envpipe.profile import Profile, embedded_profile_path, load_profile
from envpipe.profile.gpus import EMBEDDED_GPUS, IDLE_POWER_W
from envpipe.simgpu.cost import unit_s

TAIL_POWER_SHARE = 0.49  # the tail's power above blocking, as a share of the backward's (see the docstring)
KINDS = ("F", "B")
DEFAULT_TABLE = "bloom+a40_bf16"  # not the planner's default frequency model (GPT-3 on A100): a different GPU


@dataclass(frozen=True)
class StageTruth:
    """One stage's GPU: per clock (descending) each unit kind's slowdown against the highest clock and its power."""

    clocks_mhz: tuple[int, ...]
    slowdown: dict[str, np.ndarray]  # kind -> (K,) time at clock / time at the highest clock
    power_w: dict[str, np.ndarray]  # kind -> (K,) watts while the unit runs at that clock
    blocking_w: float
    table_stage: int

    def clock_index(self, mhz: int) -> int:
        try:
            return self.clocks_mhz.index(int(mhz))
        except ValueError:
            raise ValueError(f"{mhz} MHz is not a clock of this simulated GPU") from None

    def unit(self, kind: str, mhz: int, top_s: float) -> tuple[float, float]:
        """(seconds, watts) of a unit of ``kind`` lasting ``top_s`` at the highest clock, run at ``mhz``."""
        k = self.clock_index(mhz)
        return top_s * float(self.slowdown[kind][k]), float(self.power_w[kind][k])

    def tail_power_w(self, mhz: int) -> float:
        """Power of the tail (all-reduce, optimizer step) at the clock the stage holds."""
        busy = float(self.power_w["B"][self.clock_index(mhz)])
        return self.blocking_w + TAIL_POWER_SHARE * max(0.0, busy - self.blocking_w)


@dataclass(frozen=True)
class JobTruth:
    """The hidden truth of every GPU of a ``stages``-stage job: a measured table and its GPU's blocking power."""

    table: Profile
    blocking_w: float
    stages: int
    name: str

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"a job has at least one stage, got {self.stages}")
        if not self.blocking_w > 0:
            raise ValueError(f"blocking power must be positive, got {self.blocking_w!r} W")

    @classmethod
    def embedded(cls, stages: int, name: str = DEFAULT_TABLE) -> JobTruth:
        """The truth from a profile shipped with the package, with its GPU's measured blocking power (Perseus)."""
        if name not in EMBEDDED_GPUS:
            raise ValueError(f"no simulated GPU table {name!r}; choose one of {', '.join(EMBEDDED_GPUS)}")
        return cls(load_profile(embedded_profile_path(name)), IDLE_POWER_W[EMBEDDED_GPUS[name]], stages, name)

    @property
    def clocks_mhz(self) -> list[int]:
        """The simulated GPU's supported SM clocks, descending (the table's)."""
        return [int(f) for f in self.table.freqs]

    def table_stage(self, stage: int) -> int:
        """The table's stage that the job's ``stage`` runs (see the module's docstring)."""
        if not 0 <= stage < self.stages:
            raise ValueError(f"stage {stage} is not a stage of a {self.stages}-stage job")
        last = self.table.num_stages - 1
        return last if self.stages == 1 else round(stage * last / (self.stages - 1))

    def stage(self, stage: int) -> StageTruth:
        t = self.table_stage(stage)
        times = {"F": self.table.fwd_time[t], "B": self.table.bwd_time[t]}
        energies = {"F": self.table.fwd_energy[t], "B": self.table.bwd_energy[t]}
        return StageTruth(tuple(self.clocks_mhz), {k: times[k] / times[k][0] for k in KINDS},
                          {k: energies[k] / times[k] for k in KINDS}, self.blocking_w, t)

    def oracle_profile(self, flops: Sequence[tuple[float, float]]) -> Profile:
        """The true, noise-free profile of the job's stages at every clock, given each stage's (forward, backward)
        FLOPs per unit: what a planner with the whole table would plan on. Simulated, never measured."""
        if len(flops) != self.stages:
            raise ValueError(f"need (forward, backward) FLOPs for each of the {self.stages} stages, got {len(flops)}")
        tables: dict[str, list[np.ndarray]] = {"Ft": [], "Bt": [], "Fj": [], "Bj": []}
        for s, work in enumerate(flops):
            truth = self.stage(s)
            for kind, f in zip(KINDS, work, strict=True):
                seconds = unit_s(f) * truth.slowdown[kind]
                tables[kind + "t"].append(seconds)
                tables[kind + "j"].append(seconds * truth.power_w[kind])
        f_t, b_t, f_j, b_j = (np.array(tables[k]) for k in ("Ft", "Bt", "Fj", "Bj"))
        return Profile(self.table.freqs.copy(), f_t, b_t, f_j, b_j, f"simulated GPU oracle ({self.name}, noise-free)")

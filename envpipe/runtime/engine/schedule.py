"""Run a per-stage unit order inside DeepSpeed's PipelineEngine, with planned clocks and unit timing.

A stage's order is a list of ("F"|"B", micro-batch) units, optionally with a planned SM clock per unit.

- `Stock1F1BSchedule`: the pipeline's order is 1F1B. DeepSpeed's own `TrainSchedule` steps run unchanged,
  with its own p2p instructions (blocking sends, deferred to meet the neighbour's receive), and our
  clock and timing marks around each unit: the runtime in 1F1B order is stock DeepSpeed plus those marks.
- `UnitOrderSchedule`: any other order (EnvPipe's extra warm-up forwards, a plan file's). Sends are
  posted (`ISendActivation` / `ISendGrad`) and receives go over one process group per direction
  (`IRecvActivation` / `IRecvGrad`, handled by `envpipe.runtime.engine.engine.EnvPipeEngine`), so a forward sent
  early never waits for a neighbour that is not receiving yet.

Why two: measured on 2 x H200 (2026-11-23, benchmarks/results/engine_ablation_h200.md), 1F1B with every
send posted at once ran at 0.987 of stock DeepSpeed's throughput; the order most iterations run (1F1B,
and every baseline iteration) therefore keeps DeepSpeed's steps, and only an order they cannot express
takes the posted sends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from deepspeed.runtime.pipe import schedule as ds

from envpipe.plan.dag import ScheduleError
from envpipe.plan.memory import peak_in_flight
from envpipe.plan.schedules import Unit


class ISendActivation(ds.BufferOpInstruction):
    """Post a non-blocking send of the activations in `buffer_id` to the next stage."""


class ISendGrad(ds.BufferOpInstruction):
    """Post a non-blocking send of the input gradients in `buffer_id` to the previous stage."""


class IRecvActivation(ds.BufferOpInstruction):
    """Receive the activations for `buffer_id` over the forward-direction process group."""


class IRecvGrad(ds.BufferOpInstruction):
    """Receive the output gradients for `buffer_id` over the backward-direction process group."""


class SetClock(ds.PipeInstruction):
    """Ask for a new SM clock (MHz) before the next unit; never blocks the training thread."""


class UnitStart(ds.PipeInstruction):
    """Marks the start of a forward/backward unit (for measured unit timing)."""


class UnitEnd(ds.PipeInstruction):
    """Marks the end of a forward/backward unit."""


class Stretch(ds.PipeInstruction):
    """Delay the unit just run by `seconds` on its own stream, after its kernels (a rehearsal of a lower clock:
    envpipe.runtime.phases.rehearse); what depends on the unit waits as it would for the slower unit."""


class TailMark(ds.PipeInstruction):
    """Marks the gradient all-reduce (ReduceTiedGrads + ReduceGrads): "start" before it, "reduced" after."""


@dataclass(frozen=True)
class UnitExtras:
    """What rides on a stage's units besides their passes: each unit's planned clock (MHz), each unit's stretch
    (seconds, a rehearsal's), and whether units are timed (`UnitStart` / `UnitEnd` around each)."""

    clocks: Sequence[int] | None = None
    stretch: Sequence[float] | None = None
    timed: bool = False

    def check(self, stage_id: int, units: int) -> None:
        """ScheduleError where a per-unit list does not have one entry per unit (a bug, not input)."""
        for name, per_unit in (("clocks", self.clocks), ("stretches", self.stretch)):
            if per_unit is not None and len(per_unit) != units:
                raise ScheduleError(f"stage {stage_id}: {len(per_unit)} {name} for {units} units")


class UnitOrderSchedule(ds.PipeSchedule):
    """DeepSpeed PipeSchedule for one stage's unit order (and planned clocks, MHz per unit)."""

    def __init__(self, order: Sequence[Unit], micro_batches: int, stages: int, stage_id: int,
                 extras: UnitExtras = UnitExtras()) -> None:
        super().__init__(micro_batches=micro_batches, stages=stages, stage_id=stage_id)
        extras.check(stage_id, len(order))
        self.order = list(order)
        self.clocks = list(extras.clocks) if extras.clocks is not None else None
        self.timed = extras.timed
        self.stretch = list(extras.stretch) if extras.stretch is not None else None

    def num_pipe_buffers(self) -> int:
        return max(2, peak_in_flight([self.order])[0])  # the most forwards whose backward has not run

    def _unit_cmds(self, i: int, kind: str, mb: int) -> list[ds.PipeInstruction]:
        buf = self._buffer_idx(mb)
        stretch = 0.0 if self.stretch is None else self.stretch[i]
        if kind == "F":
            cmds: list[ds.PipeInstruction] = [] if self.is_first_stage else [IRecvActivation(buf)]
            if self.is_first_stage or self.is_last_stage:
                cmds.append(ds.LoadMicroBatch(buf))
            cmds += unit_cmds(kind, mb, ds.ForwardPass(buf), self.timed, stretch)
            if not self.is_last_stage:
                cmds.append(ISendActivation(buf))
            return cmds
        cmds = [] if self.is_last_stage else [IRecvGrad(buf)]
        cmds += unit_cmds(kind, mb, ds.BackwardPass(buf), self.timed, stretch)
        if not self.is_first_stage:
            cmds.append(ISendGrad(buf))
        return cmds

    def steps(self) -> Iterator[list[ds.PipeInstruction]]:
        current: int | None = None
        for i, (kind, mb) in enumerate(self.order):
            cmds: list[ds.PipeInstruction] = []
            if self.clocks is not None and self.clocks[i] != current:
                current = self.clocks[i]
                cmds.append(SetClock(mhz=current))
            yield cmds + self._unit_cmds(i, kind, mb)
        reduce: list[ds.PipeInstruction] = [ds.ReduceTiedGrads(), ds.ReduceGrads()]
        if self.timed:  # the gradient all-reduce's own time, for the report (the tail is timed by the runner)
            reduce = [TailMark(at="start"), *reduce, TailMark(at="reduced")]
        yield [*reduce, ds.OptimizerStep()]


def unit_cmds(kind: str, mb: int, cmd: ds.BufferOpInstruction, timed: bool, stretch: float
              ) -> list[ds.PipeInstruction]:
    """A unit's pass, its stretch (after its kernels, inside its time: a slower unit ends later) and its marks."""
    cmds: list[ds.PipeInstruction] = [cmd] if stretch <= 0 else [cmd, Stretch(seconds=stretch)]
    if not timed:
        return cmds
    buf = cmd.buffer_id
    return [UnitStart(kind=kind, mb=mb, buffer_id=buf), *cmds, UnitEnd(kind=kind, mb=mb, buffer_id=buf)]


class Stock1F1BSchedule(ds.TrainSchedule):
    """DeepSpeed's 1F1B `TrainSchedule` with a planned clock per unit and optional unit timing marks.

    Its units come in this stage's 1F1B order (envpipe.plan.schedules.one_f_one_b), so the i-th
    ForwardPass/BackwardPass is unit i of the order and takes clock i.
    """

    def __init__(self, micro_batches: int, stages: int, stage_id: int, extras: UnitExtras = UnitExtras()) -> None:
        super().__init__(micro_batches=micro_batches, stages=stages, stage_id=stage_id)
        extras.check(stage_id, 2 * micro_batches)
        self.clocks = list(extras.clocks) if extras.clocks is not None else None
        self.timed = extras.timed
        self.stretch = list(extras.stretch) if extras.stretch is not None else None

    def steps(self) -> Iterator[list[ds.PipeInstruction]]:
        unit, current = 0, None
        mbs = {"F": 0, "B": 0}
        for cmds in super().steps():
            out: list[ds.PipeInstruction] = []
            for cmd in cmds:
                if isinstance(cmd, ds.ForwardPass | ds.BackwardPass):
                    kind = "F" if isinstance(cmd, ds.ForwardPass) else "B"
                    if self.clocks is not None and self.clocks[unit] != current:
                        current = self.clocks[unit]
                        out.insert(0, SetClock(mhz=current))  # before the step's receive, as in UnitOrderSchedule
                    stretch = 0.0 if self.stretch is None else self.stretch[unit]
                    out += unit_cmds(kind, mbs[kind], cmd, self.timed, stretch)
                    mbs[kind] += 1
                    unit += 1
                elif isinstance(cmd, ds.ReduceTiedGrads) and self.timed:
                    out += [TailMark(at="start"), cmd]
                elif isinstance(cmd, ds.ReduceGrads) and self.timed:
                    out += [cmd, TailMark(at="reduced")]
                else:
                    out.append(cmd)
            yield out

"""Run an arbitrary per-stage unit order inside DeepSpeed's PipelineEngine.

A stage's order is a list of ("F"|"B", micro-batch) units, optionally with a planned SM clock per
unit. `UnitOrderSchedule` turns it into DeepSpeed pipe instructions. Sends are non-blocking
(`ISendActivation` / `ISendGrad`, handled by `envpipe.runtime.engine.EnvPipeEngine`), so EnvPipe's
extra warm-up forwards never wait for a neighbour that is not receiving yet.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from deepspeed.runtime.pipe import schedule as ds

from envpipe.plan.dag import ScheduleError
from envpipe.plan.schedules import Unit


class ISendActivation(ds.BufferOpInstruction):
    """Post a non-blocking send of the activations in `buffer_id` to the next stage."""


class ISendGrad(ds.BufferOpInstruction):
    """Post a non-blocking send of the input gradients in `buffer_id` to the previous stage."""


class SetClock(ds.PipeInstruction):
    """Ask for a new SM clock (MHz) before the next unit; never blocks the training thread."""


class UnitStart(ds.PipeInstruction):
    """Marks the start of a forward/backward unit (for measured unit timing)."""


class UnitEnd(ds.PipeInstruction):
    """Marks the end of a forward/backward unit."""


class TailMark(ds.PipeInstruction):
    """Marks the gradient all-reduce (ReduceTiedGrads + ReduceGrads): "start" before it, "reduced" after."""


def max_in_flight(order: Sequence[Unit]) -> int:
    """Most forwards whose backward has not run yet: the pipe buffers a stage needs."""
    live = peak = 0
    for kind, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


class UnitOrderSchedule(ds.PipeSchedule):
    """DeepSpeed PipeSchedule for one stage's unit order (and planned clocks, MHz per unit)."""

    def __init__(
        self,
        order: Sequence[Unit],
        micro_batches: int,
        stages: int,
        stage_id: int,
        clocks: Sequence[int] | None = None,
        timed: bool = False,
    ) -> None:
        super().__init__(micro_batches=micro_batches, stages=stages, stage_id=stage_id)
        if clocks is not None and len(clocks) != len(order):
            raise ScheduleError(f"stage {stage_id}: {len(clocks)} clocks for {len(order)} units")  # a bug, not input
        self.order = list(order)
        self.clocks = list(clocks) if clocks is not None else None
        self.timed = timed

    def num_pipe_buffers(self) -> int:
        return max(2, max_in_flight(self.order))

    def _unit_cmds(self, kind: str, mb: int) -> list[ds.PipeInstruction]:
        buf = self._buffer_idx(mb)
        if kind == "F":
            cmds: list[ds.PipeInstruction] = [] if self.is_first_stage else [ds.RecvActivation(buf)]
            if self.is_first_stage or self.is_last_stage:
                cmds.append(ds.LoadMicroBatch(buf))
            cmds += self._timed(kind, mb, buf, ds.ForwardPass(buf))
            if not self.is_last_stage:
                cmds.append(ISendActivation(buf))
            return cmds
        cmds = [] if self.is_last_stage else [ds.RecvGrad(buf)]
        cmds += self._timed(kind, mb, buf, ds.BackwardPass(buf))
        if not self.is_first_stage:
            cmds.append(ISendGrad(buf))
        return cmds

    def _timed(self, kind: str, mb: int, buf: int, cmd: ds.PipeInstruction) -> list[ds.PipeInstruction]:
        if not self.timed:
            return [cmd]
        return [UnitStart(kind=kind, mb=mb, buffer_id=buf), cmd, UnitEnd(kind=kind, mb=mb, buffer_id=buf)]

    def steps(self) -> Iterator[list[ds.PipeInstruction]]:
        current: int | None = None
        for i, (kind, mb) in enumerate(self.order):
            cmds: list[ds.PipeInstruction] = []
            if self.clocks is not None and self.clocks[i] != current:
                current = self.clocks[i]
                cmds.append(SetClock(mhz=current))
            yield cmds + self._unit_cmds(kind, mb)
        reduce: list[ds.PipeInstruction] = [ds.ReduceTiedGrads(), ds.ReduceGrads()]
        if self.timed:  # the gradient all-reduce's own time, for the report (the tail is timed by the runner)
            reduce = [TailMark(at="start"), *reduce, TailMark(at="reduced")]
        yield [*reduce, ds.OptimizerStep()]

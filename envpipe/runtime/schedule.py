"""Run an arbitrary per-stage unit order inside DeepSpeed's PipelineEngine.

A stage's order is a list of ("F"|"B", micro-batch) units, optionally with a planned SM clock per
unit. `UnitOrderSchedule` turns it into DeepSpeed pipe instructions. Sends are non-blocking
(`ISendActivation` / `ISendGrad`, handled by `envpipe.runtime.engine.EnvPipeEngine`), so EnvPipe's
extra warm-up forwards never wait for a neighbour that is not receiving yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from deepspeed.runtime.pipe import schedule as ds

from envpipe.plan.schedules import Unit


class ScheduleError(ValueError):
    """A unit order that the engine cannot run (wrong units, wrong order, or a deadlock)."""


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


def validate_orders(orders: Sequence[Sequence[Unit]], num_microbatches: int) -> None:
    """Raise ScheduleError unless every stage's order is runnable and the whole pipeline cannot deadlock.

    Engine constraints: forwards and backwards each in micro-batch order (p2p matches in order),
    B(m) after F(m), and on the last stage B(m) right after F(m) (its backward uses the latest loss).
    Deadlock freedom with non-blocking sends and in-order blocking receives is checked by running the
    orders: F(s,m) needs F(s-1,m) sent, B(s,m) needs B(s+1,m) sent.
    """
    P, M = len(orders), num_microbatches
    if P < 1 or M < 1:
        raise ScheduleError(f"need at least one stage and one micro-batch, got {P} and {M}")
    for s, order in enumerate(orders):
        fwd = [m for k, m in order if k == "F"]
        bwd = [m for k, m in order if k == "B"]
        if any(k not in ("F", "B") for k, _ in order):
            raise ScheduleError(f"stage {s}: unit kinds must be 'F' or 'B'")
        if fwd != list(range(M)) or bwd != list(range(M)):
            raise ScheduleError(
                f"stage {s}: forwards and backwards must each cover micro-batches 0..{M - 1} in order"
            )
        seen: set[int] = set()
        for i, (k, m) in enumerate(order):
            if k == "F":
                seen.add(m)
            elif m not in seen:
                raise ScheduleError(f"stage {s}: B{m} comes before F{m}")
            if s == P - 1 and k == "B" and order[i - 1] != ("F", m):
                raise ScheduleError(
                    f"last stage: B{m} must directly follow F{m} (DeepSpeed's backward uses the latest loss)"
                )
    simulate_orders(orders, lambda s, kind: 1.0)


def simulate_orders(
    orders: Sequence[Sequence[Unit]], duration: Callable[[int, str], float]
) -> list[list[tuple[float, float]]]:
    """(start, end) of every unit when each runs as soon as its stage and its input are free.

    F(s,m) needs F(s-1,m) done, B(s,m) needs B(s+1,m); sends never block. `duration(stage, kind)`
    gives unit times (p2p time is not modelled). Raises ScheduleError if the orders deadlock.
    """
    P = len(orders)
    pos = [{u: i for i, u in enumerate(o)} for o in orders]
    times: list[list[tuple[float, float]]] = [[] for _ in range(P)]
    progress = True
    while progress:
        progress = False
        for s in range(P):
            while len(times[s]) < len(orders[s]):
                kind, m = orders[s][len(times[s])]
                dep = s - 1 if kind == "F" else s + 1
                ready = times[s][-1][1] if times[s] else 0.0
                if 0 <= dep < P:
                    j = pos[dep][(kind, m)]
                    if j >= len(times[dep]):
                        break
                    ready = max(ready, times[dep][j][1])
                times[s].append((ready, ready + duration(s, kind)))
                progress = True
    if any(len(times[s]) < len(orders[s]) for s in range(P)):
        stuck = {s: orders[s][len(times[s])] for s in range(P) if len(times[s]) < len(orders[s])}
        raise ScheduleError(f"the orders deadlock; stages wait at {stuck}")
    return times


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
            raise ScheduleError(f"stage {stage_id}: {len(clocks)} clocks for {len(order)} units")
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
            cmds += self._timed(kind, mb, ds.ForwardPass(buf))
            if not self.is_last_stage:
                cmds.append(ISendActivation(buf))
            return cmds
        cmds = [] if self.is_last_stage else [ds.RecvGrad(buf)]
        cmds += self._timed(kind, mb, ds.BackwardPass(buf))
        if not self.is_first_stage:
            cmds.append(ISendGrad(buf))
        return cmds

    def _timed(self, kind: str, mb: int, cmd: ds.PipeInstruction) -> list[ds.PipeInstruction]:
        if not self.timed:
            return [cmd]
        return [UnitStart(kind=kind, mb=mb), cmd, UnitEnd(kind=kind, mb=mb)]

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

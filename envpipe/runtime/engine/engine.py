"""A PipelineEngine subclass that runs any unit order (envpipe.runtime.engine.schedule) with planned clocks.

Following DeepSpeed's own DualPipeVEngine, it extends `_INSTRUCTION_MAP` instead of forking the
engine: DeepSpeed's p2p handlers serve its own 1F1B steps; our posted sends and per-direction receives
serve other orders. Each adjacent stage pair gets two process groups for those, one per direction: on
NCCL, sends and receives of one group share a stream, so a posted activation send would otherwise hold
back a gradient receive from the same neighbour (and vice versa) until the neighbour posts the matching
receive, which in EnvPipe's order it does only later. Receives stay blocking and in order.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import deepspeed
import torch
import torch.distributed as tdist
from deepspeed.runtime.pipe import p2p
from deepspeed.runtime.pipe import schedule as ds
from deepspeed.runtime.pipe.engine import PipelineEngine

from envpipe.plan.dag import engine_order_dag
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime.clocks import Clock, simulated_gpu
from envpipe.runtime.engine.graphs import GraphError, Recorder, StageGraphs
from envpipe.runtime.engine.hp_grads import batch_hp_grads
from envpipe.runtime.engine.schedule import (
    IRecvActivation,
    IRecvGrad,
    ISendActivation,
    ISendGrad,
    SetClock,
    Stock1F1BSchedule,
    Stretch,
    TailMark,
    Unit,
    UnitEnd,
    UnitExtras,
    UnitOrderSchedule,
    UnitStart,
)
from envpipe.runtime.measure.memory import SavedTensorMeter
from envpipe.runtime.summary import RunSummary
from envpipe.simgpu import LINK, FlopCount, SimGpu, step_s


class EngineRun(Protocol):
    """What the engine hands its iterations, checkpoints, report and end to (`envpipe.runtime.run.EnvPipeRun`)."""

    def train_batch(self, run: Callable[[], Any]) -> Any:
        """The iteration the current phase asks for; ``run`` runs DeepSpeed's own train_batch once."""
        ...

    def save_state(self, folder: Path) -> None: ...

    def load_state(self, folder: Path) -> None: ...

    def report(self) -> RunSummary | None: ...

    def close(self) -> None: ...


@dataclass
class UnitRecord:
    kind: str
    mb: int
    start_s: float  # from the start of the iteration
    end_s: float
    mhz: int | None


class EnvPipeEngine(PipelineEngine):
    """PipelineEngine that runs a given unit order per stage (1F1B, EnvPipe, or a plan's)."""

    # set by PipelineEngine.__init__; declared so that type checkers know them
    first_output_send: bool
    pipe_recv_buf: Any
    grad_layer: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.is_pipe_partitioned or self.is_grad_partitioned:
            raise RuntimeError(
                "the EnvPipe runtime does not support partitioned (tensor-parallel) activations"
            )
        self._fwd_group, self._bwd_group = self._direction_groups()
        self._pending: list[tuple[Any, torch.Tensor]] = []
        self.unit_orders: list[list[Unit]] | None = None
        self.unit_clocks: list[list[int]] | None = None
        self.unit_stretch: list[float] | None = None  # this stage's rehearsal delay per unit (seconds)
        self._spinner: Any = None  # envpipe.runtime.engine.spin.Spinner, built at the first stretch on a GPU
        self._stretched: list[float] = []  # the delays this iteration asked for (s)
        self.clock: Clock | None = None
        self._sim: SimGpu | None = None  # a simulated GPU keeps virtual time (CPU)
        self._params: tuple[int, int] | None = None
        self.units: list[UnitRecord] = []
        self.allreduce_s: float | None = None  # last timed iteration: ReduceTiedGrads + ReduceGrads (seconds)
        self._current_mhz: int | None = None
        self._timing = False
        self._valid_orders: set[tuple[tuple[Unit, ...], ...]] = set()  # checked once, run many times
        self.saved_meter: SavedTensorMeter | None = None  # set for one iteration: activation bytes per forward
        self.iteration_host_t0 = 0.0  # host time (time.perf_counter) of the last iteration's start
        self.clocks_requested: list[int] = []  # the clocks this iteration asked for, in order
        self.envpipe: EngineRun | None = None  # the phases, attached by envpipe.initialize
        self.graphs: StageGraphs | None = None  # the stage's units replayed as recorded graphs (run_units_as_graphs)
        if self.using_bf16_optimizer:  # its gradients' hand-off in one multi-tensor add, not a loop per parameter
            batch_hp_grads(self.optimizer)

    # --- what the user's script calls: DeepSpeed's API, with EnvPipe's phases inside ---------------------
    def train_batch(self, data_iter: Any = None) -> Any:
        """DeepSpeed's `train_batch`; with EnvPipe attached, the iteration its current phase asks for."""
        if self.envpipe is None:
            return super().train_batch(data_iter)
        return self.envpipe.train_batch(lambda: super(EnvPipeEngine, self).train_batch(data_iter))

    def eval_batch(self, *args: Any, **kwargs: Any) -> Any:
        """DeepSpeed's `eval_batch`, at the highest clock (evaluation is not planned)."""
        if self.clock is not None and self.clock.controls_clocks and self._current_mhz != self.clock.supported_mhz[0]:
            self._exec_set_clock(self.clock.supported_mhz[0])
        return super().eval_batch(*args, **kwargs)

    def save_checkpoint(self, save_dir: Any, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        """DeepSpeed's checkpoint, with what EnvPipe decided (`envpipe_state.json` in the tag's folder), written
        first: DeepSpeed names the tag in `latest` last, so no crash leaves `latest` naming a tag without it."""
        tag = f"global_step{self.global_steps}" if tag is None else tag  # DeepSpeed's default, resolved here
        if self.envpipe is not None:
            self.envpipe.save_state(Path(save_dir) / str(tag))
        return super().save_checkpoint(save_dir, tag, *args, **kwargs)

    def load_checkpoint(self, load_dir: Any, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        """DeepSpeed's `load_checkpoint`; a checkpoint with EnvPipe's state resumes in its steady plan."""
        loaded = super().load_checkpoint(load_dir, tag, *args, **kwargs)
        if self.envpipe is not None and loaded[0] is not None:
            if tag is None:  # what DeepSpeed read: the `latest` file names the tag
                tag = (Path(load_dir) / "latest").read_text().strip()
            self.envpipe.load_state(Path(load_dir) / str(tag))
        return loaded

    def envpipe_report(self) -> Any:
        """Write EnvPipe's report now, e.g. at the end of training (every rank calls it: a collective call);
        the `RunSummary` on rank 0, None elsewhere or before the steady phase. Without this call the report
        is written at the end of the comparison iterations and every `summary_interval` iterations."""
        if self.envpipe is None:
            raise RuntimeError("no EnvPipe run on this engine: build it with envpipe.initialize")
        return self.envpipe.report()

    def destroy(self) -> None:
        if self.envpipe is not None:
            self.envpipe.close()
        super().destroy()

    def _direction_groups(self) -> tuple[Any, Any]:
        """Create (collectively, on every rank) a forward and a backward group per adjacent pair."""
        mine: dict[tuple[int, int], Any] = {}
        for ranks in self.grid._topo.get_axis_comm_lists("pipe"):
            for a, b in itertools.pairwise(ranks):
                mine[(a, b)] = (tdist.new_group([a, b]), tdist.new_group([a, b]))
        me = self.global_rank
        nxt = self.grid.stage_to_global(self.stage_id + 1) if not self.is_last_stage() else None
        prv = self.grid.stage_to_global(self.stage_id - 1) if not self.is_first_stage() else None
        # fwd group: my link to the next stage (I send activations); bwd: link to the previous one.
        fwd = {
            "next": mine[(me, nxt)][0] if nxt is not None else None,
            "prev": mine[(prv, me)][0] if prv is not None else None,
        }
        bwd = {
            "next": mine[(me, nxt)][1] if nxt is not None else None,
            "prev": mine[(prv, me)][1] if prv is not None else None,
        }
        return fwd, bwd

    def set_unit_orders(
        self,
        orders: Sequence[Sequence[Unit]],
        clocks: Sequence[Sequence[int]] | None = None,
        clock: Clock | None = None,
        timing: bool = False,
        stretch: Sequence[float] | None = None,
    ) -> None:
        """Use these per-stage orders (all stages, same on every rank) for the following iterations; ``stretch``:
        this stage's delay per unit of its order (a rehearsal: envpipe.runtime.phases.rehearse)."""
        if len(orders) != self.num_stages:
            raise ValueError(f"the plan has {len(orders)} stages, the pipeline {self.num_stages}")
        key = tuple(tuple(o) for o in orders)
        if key not in self._valid_orders:
            engine_order_dag(orders, self.micro_batches)  # ScheduleError (one line) for an order it cannot run
            self._valid_orders.add(key)
        self.unit_orders = [list(o) for o in orders]
        self.unit_clocks = [list(c) for c in clocks] if clocks is not None else None
        self.unit_stretch = list(stretch) if stretch is not None and any(stretch) else None
        if self.unit_stretch is not None and self._on_gpu and self._spinner is None:
            from envpipe.runtime.engine.spin import Spinner

            self._spinner = Spinner(self.device)
        self.clock = clock
        self._sim = simulated_gpu(clock)
        self._timing = timing or (clock is not None and clock.needs_unit_times)

    def run_units_as_graphs(self, recorder: Recorder) -> None:
        """Replay this stage's training forwards and backwards as recorded graphs (envpipe.runtime.engine.graphs),
        recorded at their first use; GraphError (one line) where the stage cannot be recorded."""
        why = recorder.unavailable(self.device)
        if why is not None:
            raise GraphError(f"cuda_graphs: {why}")
        if self.module.activation_checkpoint_interval > 0:
            raise GraphError("cuda_graphs: activation checkpointing recomputes the forward inside the backward, "
                             "which a recording cannot; set the PipelineModule's activation_checkpoint_interval=0")
        if self.module.seed_layers:
            raise GraphError("cuda_graphs: seed_layers reseeds the host's generator at every layer, which a "
                             "recording would do only once")
        self.graphs = StageGraphs(self.module, recorder)

    def has_run(self, orders: Sequence[Sequence[Unit]]) -> bool:
        """These per-stage orders were set for an iteration before (each order is checked once, when first set)."""
        return tuple(tuple(o) for o in orders) in self._valid_orders

    def time_units(self, on: bool) -> None:
        """Time units (CUDA events, one synchronize) in the next iterations or not. A clock that must
        see every unit (the sim clock stretches each one) has units always timed."""
        self._timing = on or (self.clock is not None and self.clock.needs_unit_times)

    def _train_schedule(self) -> ds.PipeSchedule:
        if self.unit_orders is None:
            self.unit_orders = one_f_one_b(self.num_stages, self.micro_batches)
        clocks = self.unit_clocks[self.stage_id] if self.unit_clocks is not None else None
        extras = UnitExtras(clocks, self.unit_stretch, self._timing)
        if self.unit_orders == one_f_one_b(self.num_stages, self.micro_batches):  # every stage decides alike
            return Stock1F1BSchedule(self.micro_batches, self.num_stages, self.stage_id, extras)
        return UnitOrderSchedule(self.unit_orders[self.stage_id], self.micro_batches, self.num_stages, self.stage_id,
                                 extras)

    def _exec_schedule(self, pipe_schedule: ds.PipeSchedule) -> None:
        self.units = []
        self.clocks_requested = []
        self._stretched = []
        self._gpu_units: list[tuple[str, int, Any, Any, int | None]] = []
        self._tail_marks: dict[str, Any] = {}
        self._t0 = self._now()
        if self._on_gpu:
            self._t0_event = self._event()
        if self.graphs is not None:
            self.graphs.new_iteration()
        super()._exec_schedule(pipe_schedule)
        self._wait_sends()  # every posted send is waited on and its tensor released each iteration
        if self._sim is not None and self._tail_marks:  # the optimizer step after the all-reduce
            self._sim.tail(step_s(self._parameter_bytes()[0]))
        self.iteration_host_t0 = self._t0
        if self._gpu_units:  # resolve GPU unit times once per iteration, not per unit
            self._resolve_gpu_units()
        marks = self._tail_marks
        self.allreduce_s = marks["reduced"] - marks["start"] if marks else None

    def _resolve_gpu_units(self) -> None:
        """Unit times (and the all-reduce marks) from CUDA events, and the host time of the first event.

        One synchronize per iteration: an event recorded on the idle device completes at once, so
        the host clock read right after it maps GPU time to host time (for the energy meter).
        """
        torch.cuda.synchronize()
        end = self._event()
        end.synchronize()
        host_end = time.perf_counter()
        ms = self._t0_event.elapsed_time
        end_s = ms(end) / 1e3  # when the schedule (sends and optimizer step included) ended
        self.iteration_host_t0 = host_end - end_s
        self.units = [UnitRecord(k, m, ms(a) / 1e3, ms(b) / 1e3, mhz) for k, m, a, b, mhz in self._gpu_units]
        self._tail_marks = {k: ms(e) / 1e3 for k, e in self._tail_marks.items()}

    @property
    def _on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def _now(self) -> float:
        """Host time, or on a simulated GPU its virtual time (CPU unit times are taken in it)."""
        return self._sim.now() if self._sim is not None else time.perf_counter()

    @staticmethod
    def _event() -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    # --- non-blocking p2p -------------------------------------------------------------------------
    def _isend(self, tensors: Sequence[torch.Tensor], dst_stage: int, group: Any) -> None:
        dst = self.grid.stage_to_global(dst_stage)
        self._pending = [(h, t) for h, t in self._pending if not h.is_completed()]
        for t in tensors:
            t = t.contiguous()
            self._pending.append((tdist.isend(t, dst, group=group), t))  # keep t alive until waited

    def _recv(self, tensor: torch.Tensor, src_stage: int, group: Any) -> None:
        work = tdist.irecv(tensor, self.grid.stage_to_global(src_stage), group=group)
        if work is not None:  # None only for a rank outside the group
            work.wait()

    def _exec_isend_activations(self, buffer_id: int) -> None:
        outputs = self.pipe_buffers["outputs"][buffer_id]
        if self.has_attention_mask or self.has_bool_tensors:  # NCCL cannot send bool (as DeepSpeed)
            outputs = (*outputs[:-1], outputs[-1].half())
        if self.dynamic_shape or self.first_output_send:
            self.first_output_send = False
            self._send_tensor_meta(outputs, self.next_stage)
        tensors = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        self._isend(tensors, self.next_stage, self._fwd_group["next"])
        self._virtual_time_out(lambda t: self._isend([t], self.next_stage, self._fwd_group["next"]), tensors)

    def _exec_isend_grads(self, buffer_id: int) -> None:
        inputs = self.pipe_buffers["inputs"][buffer_id]
        if isinstance(inputs, torch.Tensor):
            grads = [inputs.grad]
        else:
            if self.has_attention_mask or self.has_bool_tensors:
                inputs = inputs[:-1]  # the mask has no gradient; the receiver skips it too
            grads = [t.grad for t in inputs if t.is_floating_point()]
        sendable = [g for g in grads if g is not None]
        if len(sendable) != len(grads):
            raise RuntimeError(f"stage {self.stage_id}: an input has no gradient to send back")
        self._isend(sendable, self.prev_stage, self._bwd_group["prev"])
        self._virtual_time_out(lambda t: self._isend([t], self.prev_stage, self._bwd_group["prev"]), sendable)
        self.pipe_buffers["inputs"][buffer_id] = None

    def _exec_irecv_activations(self, buffer_id: int) -> None:
        if self.dynamic_shape or self.pipe_recv_buf is None:
            self.pipe_recv_buf = self._recv_tensor_meta(self.prev_stage)
        group = self._fwd_group["prev"]
        if isinstance(self.pipe_recv_buf, torch.Tensor):
            self._recv(self.pipe_recv_buf, self.prev_stage, group)
            recvd: Any = self.pipe_recv_buf.clone().detach()
            recvd.requires_grad = recvd.is_floating_point()
        else:
            parts = []
            for buf in self.pipe_recv_buf:
                self._recv(buf, self.prev_stage, group)
                parts.append(buf.clone().detach())
            if self.has_attention_mask or self.has_bool_tensors:
                parts[-1] = parts[-1].bool()
            for t in parts:
                t.requires_grad = t.is_floating_point()
            recvd = tuple(parts)
        self.pipe_buffers["inputs"][buffer_id] = recvd
        self._virtual_time_in(lambda t: self._recv(t, self.prev_stage, group))

    def _exec_irecv_grads(self, buffer_id: int) -> None:
        outputs = self.pipe_buffers["outputs"][buffer_id]
        if self.dynamic_shape or self.grad_layer is None:
            if isinstance(outputs, torch.Tensor):
                self.grad_layer = self._allocate_or_extend_buffers(0, list(outputs.size()), outputs.dtype)
            else:
                shapes = [(list(t.size()), t.dtype) for t in outputs if t.is_floating_point()]
                self.grad_layer = [
                    self._allocate_or_extend_buffers(i, s, d) for i, (s, d) in enumerate(shapes)
                ]
        group = self._bwd_group["next"]
        for buf in [self.grad_layer] if isinstance(self.grad_layer, torch.Tensor) else self.grad_layer:
            self._recv(buf, self.next_stage, group)
        self._virtual_time_in(lambda t: self._recv(t, self.next_stage, group))

    def _wait_sends(self) -> None:
        for handle, _ in self._pending:
            handle.wait()
        self._pending = []

    # --- clocks and unit timing -------------------------------------------------------------------
    def _exec_set_clock(self, mhz: int) -> None:
        self._current_mhz = mhz
        self.clocks_requested.append(mhz)
        if self.clock is not None:
            self.clock.set(mhz)

    def _exec_unit_start(self, kind: str, mb: int, buffer_id: int) -> None:
        if self._on_gpu:  # CUDA events: no synchronisation per unit
            self._unit_event = self._event()
        if kind == "F" and self.saved_meter is not None:
            self.saved_meter.start()
        if self._sim is not None:  # the unit runs on the simulated GPU: its work is counted, never timed
            self._unit_start = self._sim.unit_start()
            self._flops = FlopCount().start() if self._sim.needs_flops(kind) else None
        else:
            self._unit_start = time.perf_counter()

    def _exec_unit_end(self, kind: str, mb: int, buffer_id: int) -> None:
        if kind == "F" and self.saved_meter is not None:
            self.saved_meter.stop(self.pipe_buffers["outputs"][buffer_id])
        if self._on_gpu:
            self._gpu_units.append((kind, mb, self._unit_event, self._event(), self._current_mhz))
            return
        if self._sim is not None:
            end = self._sim.unit_end(kind, self._flops.stop() if self._flops is not None else None)
        else:
            end = time.perf_counter()
        self.units.append(UnitRecord(kind, mb, self._unit_start - self._t0, end - self._t0, self._current_mhz))

    def _exec_forward_pass(self, buffer_id: int) -> None:
        if self.graphs is None:
            return super()._exec_forward_pass(buffer_id)
        self.graphs.eager = self.saved_meter is not None  # metering counts what autograd saves: run it eagerly
        with self.graphs.forward_slot(buffer_id):
            super()._exec_forward_pass(buffer_id)

    def _exec_backward_pass(self, buffer_id: int) -> None:
        super()._exec_backward_pass(buffer_id)
        if self.graphs is not None:
            self.graphs.backward_done(buffer_id)

    def _exec_stretch(self, seconds: float) -> None:
        """The unit just run, longer by ``seconds``: a GPU spins on its timer after the unit's kernels, on the unit's
        stream (so its sends and the next unit wait for it); a simulated GPU ends the unit later."""
        if self._spinner is not None:
            self._spinner.delay(seconds)
        elif self._sim is not None:
            self._sim.stretch(seconds)
        else:
            time.sleep(seconds)
        self._stretched.append(seconds)

    def stretched(self) -> tuple[float, float] | None:
        """The last iteration's delays: (asked, inserted) seconds; inserted is what a GPU's timer spun (waits for
        it), else what was asked. None where the iteration stretched nothing."""
        if not self._stretched:
            return None
        asked = sum(self._stretched)
        return asked, self._spinner.inserted_s() if self._spinner is not None else asked

    def _exec_tail_mark(self, at: str) -> None:
        if self._sim is not None and at == "reduced":  # the gradient all-reduce on the simulated link
            self._sim.tail(LINK.allreduce_s(self._parameter_bytes()[1], self.grid.get_data_parallel_world_size()))
        self._tail_marks[at] = self._event() if self._on_gpu else self._now() - self._t0

    def _parameter_bytes(self) -> tuple[int, int]:
        """(trainable parameters, their gradients' bytes) of this stage, counted once."""
        if self._params is None:
            params = [p for p in self.module.parameters() if p.requires_grad]
            self._params = (sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params))
        return self._params

    # --- a simulated GPU's virtual time travels with every activation and gradient ------------------
    def _virtual_time_out(self, send: Any, tensors: Any) -> None:
        """Send when the data arrives: the unit's end plus the simulated link's transfer of ``tensors``."""
        if self._sim is not None:
            parts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            nbytes = sum(t.numel() * t.element_size() for t in parts if isinstance(t, torch.Tensor))
            send(torch.tensor([self._sim.now() + self._sim.transfer_s(nbytes)], dtype=torch.float64))

    def _virtual_time_in(self, recv: Any) -> None:
        if self._sim is not None:
            stamp = torch.zeros(1, dtype=torch.float64)
            recv(stamp)
            self._sim.data_ready(float(stamp))

    def _exec_send_activations(self, buffer_id: int) -> None:  # DeepSpeed's own (Stock1F1BSchedule)
        outputs = self.pipe_buffers["outputs"][buffer_id]
        super()._exec_send_activations(buffer_id)
        self._virtual_time_out(lambda t: p2p.send(t, self.next_stage), outputs)

    def _exec_send_grads(self, buffer_id: int) -> None:
        inputs = self.pipe_buffers["inputs"][buffer_id]  # DeepSpeed drops them once their gradients are sent
        grads = [t.grad for t in ([inputs] if isinstance(inputs, torch.Tensor) else inputs) if t.grad is not None]
        super()._exec_send_grads(buffer_id)
        self._virtual_time_out(lambda t: p2p.send(t, self.prev_stage), grads)

    def _exec_recv_activations(self, buffer_id: int) -> None:
        super()._exec_recv_activations(buffer_id)
        self._virtual_time_in(lambda t: p2p.recv(t, self.prev_stage))

    def _exec_recv_grads(self, buffer_id: int) -> None:
        super()._exec_recv_grads(buffer_id)
        self._virtual_time_in(lambda t: p2p.recv(t, self.next_stage))

    _INSTRUCTION_MAP: ClassVar[dict[type, Any]] = {
        **PipelineEngine._INSTRUCTION_MAP,  # DeepSpeed's own p2p for its own 1F1B steps (Stock1F1BSchedule)
        ds.ForwardPass: _exec_forward_pass,
        ds.BackwardPass: _exec_backward_pass,
        ds.SendActivation: _exec_send_activations,
        ds.SendGrad: _exec_send_grads,
        ds.RecvActivation: _exec_recv_activations,
        ds.RecvGrad: _exec_recv_grads,
        IRecvActivation: _exec_irecv_activations,
        IRecvGrad: _exec_irecv_grads,
        ISendActivation: _exec_isend_activations,
        ISendGrad: _exec_isend_grads,
        SetClock: _exec_set_clock,
        Stretch: _exec_stretch,
        UnitStart: _exec_unit_start,
        UnitEnd: _exec_unit_end,
        TailMark: _exec_tail_mark,
    }


@contextlib.contextmanager
def engine_class() -> Iterator[None]:
    saved = deepspeed.PipelineEngine
    deepspeed.PipelineEngine = EnvPipeEngine  # deepspeed.initialize resolves this name at call time
    try:
        yield
    finally:
        deepspeed.PipelineEngine = saved


def build(**kwargs: Any) -> EnvPipeEngine:
    """`deepspeed.initialize(**kwargs)`'s engine as a bare EnvPipeEngine: no phases (tests and benchmarks that
    run given unit orders; scripts use envpipe.initialize)."""
    with engine_class():
        engine = deepspeed.initialize(**kwargs)[0]
    if not isinstance(engine, EnvPipeEngine):
        raise TypeError("an EnvPipeEngine needs a deepspeed.pipe.PipelineModule as model")
    return engine

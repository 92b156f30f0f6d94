"""A stage's training forward and backward replayed as CUDA graphs, one recording per micro-batch in flight.

Where the host sets the pace (narrow layers, small micro-batches: envpipe.search.timing) a unit lasts as long
as Python takes to issue its kernels, and that time moves with the host: measured on one H200, eager units
moved 25-67 % between rounds where graphed ones moved at most 3.9 %, and ran 1.16-4.18x faster
(benchmarks/results/graphed_units_h200.md). A recorded graph is replayed by one launch, so the unit's time is
the device's.

A recording (``Recording``) holds static tensors: the forward's inputs and outputs, the gradients its
backward takes and gives, and, in its memory pool, what the forward saves for the backward. A replay writes
over all of them, so each micro-batch in flight (forwarded, its backward not yet run) needs a recording of
its own. ``StageGraphs`` hands a forward the first free one (its *slot*) and frees it at the micro-batch's
backward; a stage keeps as many recordings as it ever has micro-batches in flight (1 on one stage, P - s on
stage s of 1F1B, more in EnvPipe's orders), each with its own pool: recordings that share a pool must replay
in the order they were recorded, which the forwards and backwards of a pipeline schedule do not. Every slot's
pool keeps its forward's and backward's transient memory as well.

Gradients leave a replay as copies (``_Replay.backward``): a returned tensor may become a parameter's or an input's
``.grad`` as it is (autograd takes an unshared gradient instead of copying it), and the next replay would then
write over a gradient still being accumulated or sent (torch.cuda.make_graphed_callables returns its static
buffers: pytorch/pytorch#181723), made by one multi-tensor multiply by 1 (exact) rather than a clone per parameter,
the host's work per parameter being what is left to set a graphed backward's pace (the engine batches DeepSpeed's
BF16_Optimizer's hand-off to its accumulators too: envpipe.runtime.engine.hp_grads). Forwards without gradients
(evaluation, no_grad) run eagerly, as does a forward while ``eager`` is set (the runtime's activation metering,
which needs autograd's saved tensors).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

Tensors = tuple[torch.Tensor, ...]
WARMUP_ITERATIONS = 3  # eager forward and backward passes on a side stream before recording, as torch's own recipe


class GraphError(RuntimeError):
    """A stage cannot run as graphs, or a forward does not match its recording (one line)."""


@dataclass(frozen=True)
class Recording:
    """One recorded forward and backward and the static tensors their replays read and write."""

    inputs: Tensors  # the forward copies its arguments here
    outputs: Tensors  # where the forward's replay leaves its outputs
    grad_outputs: tuple[torch.Tensor | None, ...]  # per output: the backward copies the output's gradient here
    grad_inputs: tuple[torch.Tensor | None, ...]  # per input requiring grad, then per parameter (None: unused)
    single: bool  # the forward returned one tensor, not a tuple
    replay_forward: Callable[[], None]
    replay_backward: Callable[[], None]


class Recorder(Protocol):
    """Records a stage's forward and backward (CUDA graphs on a GPU; tests have a CPU recorder of the same kind)."""

    def unavailable(self, device: torch.device) -> str | None:
        """Why stages on ``device`` cannot be recorded, or None."""
        ...

    def record(self, forward: StageCall, params: Mapping[str, torch.Tensor], sample: Tensors) -> Recording:
        """Record ``forward(leaves, *inputs)`` on inputs like ``sample``, differentiated by the inputs that require
        grad and by ``leaves``: per parameter a new leaf on the parameter's storage (``leaves_of``)."""
        ...

    def release_cached(self) -> None:
        """Give the device back what the allocator holds cached and no tensor or recording uses."""
        ...


StageCall = Callable[..., Any]  # (parameters by name, *inputs) -> the stage's output


def leaves_of(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A new autograd leaf per parameter, on the parameter's storage: it reads the values the optimizer writes
    in place, and its autograd node is the recording's own. Differentiating the parameters themselves would join
    their accumulation nodes to the recording, and those live on the stream where they were made (the default
    stream, where the engine's replays and DeepSpeed's hooks made them), which a capture cannot wait on."""
    return {name: p.detach().requires_grad_(p.requires_grad) for name, p in params.items()}


class CudaGraphs:
    """Recordings as CUDA graphs, torch's recipe for a training step: warm-up passes, then the forward and the
    backward recorded into one private memory pool, all on one side stream."""

    def unavailable(self, device: torch.device) -> str | None:
        return None if device.type == "cuda" else f"CUDA graphs need a CUDA device; this stage runs on {device.type}"

    def record(self, forward: StageCall, params: Mapping[str, torch.Tensor], sample: Tensors) -> Recording:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            inputs = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in sample)
            leaves = leaves_of(params)
            wrt = tuple(t for t in inputs if t.requires_grad) + tuple(leaves.values())
            for _ in range(WARMUP_ITERATIONS):
                outputs = _flat(forward(leaves, *inputs))
                trained = [o for o in outputs if o.requires_grad]
                torch.autograd.grad(trained, wrt, [torch.ones_like(o) for o in trained], allow_unused=True)
            del outputs, trained
            pool = torch.cuda.graph_pool_handle()
            forward_graph, backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            # thread-local: the process group's watchdog thread may query events while this thread records
            with torch.cuda.graph(forward_graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                returned = forward(leaves, *inputs)
            outputs = _flat(returned)
            grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in outputs)
            with torch.cuda.graph(backward_graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                grads = torch.autograd.grad([o for o in outputs if o.requires_grad], wrt,
                                            [g for g in grad_outputs if g is not None], allow_unused=True)
        torch.cuda.current_stream().wait_stream(side)
        return Recording(inputs, tuple(o.detach() for o in outputs), grad_outputs, tuple(grads),
                         isinstance(returned, torch.Tensor), forward_graph.replay, backward_graph.replay)

    def release_cached(self) -> None:
        torch.cuda.empty_cache()  # the recordings' private pools keep their blocks


class StageGraphs:
    """A stage module whose training forwards (and so their backwards) replay recordings, one per micro-batch in
    flight. The engine opens a slot for each forward (``forward_slot``) and frees it after the micro-batch's
    backward (``backward_done``)."""

    def __init__(self, stage: torch.nn.Module, recorder: Recorder) -> None:
        # the stage's own hooks run around every call (DeepSpeed's engine has some); its layers' would be recorded
        hooked = [name for name, m in stage.named_modules() if m is not stage and (
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)]
        if hooked:
            raise GraphError(f"cuda_graphs: layer {hooked[0]!r} of the stage has hooks, which a recording would run "
                             "only once")
        self._stage, self._recorder = stage, recorder
        self._forward = stage.forward  # the module's own
        self._view = _Own(stage, self._forward)
        self._names = {f"stage.{name}": p for name, p in stage.named_parameters() if p.requires_grad}
        self._params = tuple(self._names.values())
        self._recordings: list[tuple[Recording, tuple[Any, ...]]] = []  # per slot, with its inputs' signature
        self._busy: dict[int, int] = {}  # buffer id -> slot of the micro-batch in flight there
        self._slot: int | None = None  # the slot of the forward being run
        self._recorded_on: tuple[int, ...] = ()  # the parameters' storage the recordings read
        self.eager = False  # run training forwards eagerly (activation metering)
        stage.forward = self._dispatch

    @property
    def recorded(self) -> int:
        """How many recordings the stage holds (the most micro-batches it has had in flight)."""
        return len(self._recordings)

    @contextlib.contextmanager
    def forward_slot(self, buffer_id: int) -> Iterator[None]:
        """The slot for the forward of the micro-batch in pipeline buffer ``buffer_id``, held while it runs."""
        busy = set(self._busy.values())
        self._slot = self._busy[buffer_id] = next(s for s in range(len(busy) + 1) if s not in busy)
        try:
            yield
        finally:
            self._slot = None

    def backward_done(self, buffer_id: int) -> None:
        self._busy.pop(buffer_id, None)

    def eager_done(self) -> None:
        """Forwards ran eagerly (``eager``): the blocks they left cached are ones the recordings' private pools
        never reuse, which would stay reserved beside them (on 2 x H200 a stage held 8-28 % more than the
        search predicted for it, 2026-11-29): given back."""
        self._recorder.release_cached()

    def new_iteration(self) -> None:
        """Every micro-batch of the last iteration is done (an iteration that failed may have left some). A
        parameter given new storage since the recordings (``param.data = ...``: a checkpoint loaded that way, an
        optimizer that swaps tensors) would leave them reading the old one: they are dropped, and recorded again
        at their next use."""
        self._busy.clear()
        if self._recordings and self._storage() != self._recorded_on:
            self._recordings.clear()

    def _dispatch(self, forward_input: Any) -> Any:
        if self._slot is None or self.eager or not (self._stage.training and torch.is_grad_enabled()):
            return self._forward(forward_input)
        packed = isinstance(forward_input, tuple)
        args: Tensors = forward_input if packed else (forward_input,)
        signature = tuple((t.shape, t.dtype, t.requires_grad) for t in args)
        if self._slot == len(self._recordings):
            self._recorded_on = self._storage()

            def forward(leaves: dict[str, torch.Tensor], *inputs: torch.Tensor) -> Any:
                return torch.func.functional_call(self._view, leaves, (inputs if packed else inputs[0],))

            self._recordings.append((self._recorder.record(forward, self._names, args), signature))
        recording, recorded = self._recordings[self._slot]
        if signature != recorded:
            raise GraphError(f"cuda_graphs: a forward's inputs ({_describe(signature)}) differ from the recorded "
                             f"({_describe(recorded)}): graphs need the same shapes every micro-batch")
        outputs = _Replay.apply(recording, *args, *self._params)
        return outputs[0] if recording.single else outputs

    def _storage(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self._params)


class _Own(torch.nn.Module):
    """The stage's own forward, without the stage's hooks (they run around the replay, at every call), as a
    module whose parameters are the stage's, under the name ``stage.``, for torch.func.functional_call."""

    def __init__(self, stage: torch.nn.Module, forward: Callable[[Any], Any]) -> None:
        super().__init__()
        self.stage = stage
        self._forward = forward

    def forward(self, forward_input: Any) -> Any:
        return self._forward(forward_input)


class _Replay(torch.autograd.Function):
    """A recording's forward and backward as one autograd node: the forward copies the arguments in and replays,
    the backward copies the outputs' gradients in, replays, and returns copies of the gradients (x * 1.0, exact)."""

    @staticmethod
    def forward(ctx: Any, recording: Recording, *args: torch.Tensor) -> Tensors:  # type: ignore[override]
        ctx.recording = recording
        for static, given in zip(recording.inputs, args[:len(recording.inputs)], strict=True):
            if static.data_ptr() != given.data_ptr():
                static.copy_(given)
        recording.replay_forward()
        return tuple(o.detach() for o in recording.outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        recording: Recording = ctx.recording
        for static, grad in zip(recording.grad_outputs, grads, strict=True):
            if static is not None and grad is not None and static.data_ptr() != grad.data_ptr():
                static.copy_(grad)
        recording.replay_backward()
        computed = [g for g in recording.grad_inputs if g is not None]
        copies = iter(torch._foreach_mul(computed, 1.0) if computed else [])  # one launch, not a clone each
        given = iter(next(copies) if g is not None else None for g in recording.grad_inputs)
        inputs = tuple(next(given) if t.requires_grad else None for t in recording.inputs)
        return (None, *inputs, *given)


def _flat(outputs: Any) -> Tensors:
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    if isinstance(outputs, tuple) and all(isinstance(o, torch.Tensor) for o in outputs):
        return outputs
    raise GraphError(f"cuda_graphs: a stage's forward must return a tensor or a tuple of tensors, got "
                     f"{type(outputs).__name__}")


def _describe(signature: tuple[Any, ...]) -> str:
    return ", ".join(f"{list(shape)} {str(dtype).removeprefix('torch.')}" for shape, dtype, _ in signature)

"""Per-layer profiler: forward/backward time and memory of every pipeline layer, per micro-batch size.

Measures the layers exactly as the training job builds them (the caller hands over the same layer
builders DeepSpeed's PipelineModule gets) and writes an `envpipe.search.layers.LayerProfile`. On CPU the
device is the runtime's simulated GPU (``simulated_gpu_times``): its unit times are the ones the runtime's
simulated GPU charges. It lives
in envpipe.layerprof, not envpipe.profile, because it needs torch: envpipe.profile and envpipe.search stay
importable where only the planner is installed.

One layer is built at a time (a model larger than one device can still be profiled); each layer's input
is the previous layer's real output, so shapes and dtypes are the training job's. Per micro-batch size:
warm-up units, then ``reps`` timed rounds of forward and backward units (their median).

On GPUs a unit has three times, the device's, the host's and the repeat time (envpipe.search.timing runs
them as the engine does: one layer after the other, the device behind the host, a synchronization before
every forward). Each of ``reps`` repetitions takes three rounds, each starting on an idle device:
- a round of 1 unit and a round of ``_QUEUE`` units without a hold, the device running the units as the
  host issues them, as in the engine. A layer whose output can be its own input (a transformer block) is
  chained, as the engine issues a stage: one forward pass through the layer applied ``_QUEUE`` times (once)
  and one ``backward()`` over it, DeepSpeed's BF16_Optimizer work around it (one zeroing call before, every
  application's gradients added into the flat buffer after). Other layers (the embedding, the head) run
  their units one after the other, each with its own ``backward()``, and lose the unit calls measured below.
  The host and repeat times are the differences of the two rounds over ``_QUEUE - 1`` units: of the host's
  issuing, and of the spans from the synchronization before them to the device's end. What a round pays once
  (its first launch, its final synchronization, the ``backward()`` call and the zeroing) is in both and
  cancels: the layer's share of a stage (H100, 2026-11-25: a layer's own ``backward()`` took 1.19-1.30 times
  the host time of the same layer inside a chain of 8, far more than the calls measured alone; a round of 4
  over 4 put repeat sums 1-10 % above the engine's device-bound units). A layer chained with itself issues a
  little faster than a chain of different layers (0.87-0.94 of it, benchmarks/layer_chain_check.py): the
  search's engine model, fitted on training runs, scales the host times for that;
- a held round: the device held by a spin kernel (``_DeviceHold``) while the host issues ``_QUEUE``
  forwards and their backwards, and then running the queued units back to back, timed by CUDA events: the
  device's time. The hold lasts twice the host's issuing of the free round (issuing behind a held device
  costs the host more: in the first H100 runs, 2026-11-25, host times taken so summed to 1.5 times the
  engine's launch-bound units); a round in which it ended before the host was done is repeated with a
  hold twice as long.
A narrow layer at a small micro-batch takes the host longer than the device (launch-bound); a
synchronization around every unit would charge both (H200, 2026-11-23: a profile so taken put a 16-block
GPT-2 stage's unit at micro-batch 2 a third above the training run's), and one number per unit cannot tell
a launch-bound stage from a device-bound one (H100, 2026-11-24: the search's time was 15-19 % short at
micro-batches 2 and 4 of a 1536-wide GPT-2). On CPU a round is one unit and its host time 0: the simulated
GPU charges counted FLOPs by its one cost rule (envpipe.simgpu.cost), there is no launch to hide.

Once per profile, on GPUs, the unit calls (``UnitCalls``), which the engine pays once per micro-batch and
stage: the host's cost of one ``backward()`` call beyond its kernels (two roots' backward in two calls less
in one call) and, bf16, of one gradient zeroing (two tensors zeroed in two calls less in one). And per
micro-batch size the job's batch function, the device synchronized at both ends: the micro-batch's load the
engine does before every forward.

Then one unit under the allocation probe (``AllocationWindows``). Every backward does what DeepSpeed's
pipeline engine adds to it (bf16, BF16_Optimizer): the weights' gradients zeroed before, each added into
its slice of a flat bf16 accumulation buffer after, one parameter at a time, as BF16_Optimizer's
``_update_hp_grad`` does it. Per layer also one optimizer
step as DeepSpeed takes it: torch AdamW on the fp32 weights (fp32), or BF16_Optimizer's (the norm of every
gradient in fp32, the flat buffer cast to fp32 for AdamW on the flat fp32 master weights, the weights
copied back, the buffer zeroed).

At the end, on GPUs, the device's memory outside the tensors: what the process holds outside the caching
allocator (CUDA context, library handles, kernel images) and the workspaces that stay allocated
(``DeviceMemory``).

Clocks are never changed. On GPUs the busy power is the device's while it computes, from the NVML energy
counter per micro-batch size: after a layer is timed, free rounds of its units back to back for about
``_POWER_WINDOW_S`` (a count of rounds from its measured repeat times), the counter read around them; every
layer's energy, less the idle power over the time the device did not compute (the window less its units'
device times), over that computing time (before 2026-11-29 one busy power was read over the whole profiling, its
idle gaps, holds and allocation probes included: on 2 x H200 the search's energy came out 26 to 58 % below
the training runs' measured, benchmarks/results/search_h200x2_call9.md); the idle power the counter over
``idle_seconds`` before any work. On CPU both come from the simulated GPU's frequency model and are labelled
simulated.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import NamedTuple

import torch
from torch.utils.flop_counter import FlopCounterMode

from envpipe.energy.meter import nvml_id, nvml_reader
from envpipe.profile import FrequencyModel
from envpipe.profile.gpus import GPU_FILTERS
from envpipe.quiet import STDERR, STDOUT, native_output_silenced
from envpipe.search.layers import (
    NO_DEVICE_MEMORY,
    DeviceMemory,
    Layer,
    LayerCost,
    LayerProfile,
    ModelShape,
    UnitCalls,
)
from envpipe.simgpu import step_s, unit_s

_WINDOW = "envpipe.window."
_QUEUE = 4  # GPU units per timed round (see the module's docstring)
_HOLD_TRIES = 6  # rounds with a longer hold before a unit counts as one that waits for its device
_CALL_REPS = 64  # samples of each unit call's host time (tens of microseconds each)
# GPUs: per layer and micro-batch size, free rounds back to back for about this long under the energy counter
_POWER_WINDOW_S = 0.1
_MAX_POWER_ROUNDS = 10_000
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class AllocationWindows:
    """Bytes allocated inside named windows: what stays allocated at the window's end (``held``) and the
    peak above the level at its start (``peak``). The allocator's own accounting: torch.cuda's counters on
    GPUs; on CPU the memory events of torch's profiler (every allocation and free through torch's CPU
    allocator), read when the probe closes. Used as a context manager around all windows."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._result: dict[str, tuple[int, int]] = {}
        self._prof: torch.profiler.profile | None = None

    def __enter__(self) -> AllocationWindows:
        if self.device.type == "cpu":
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            with native_output_silenced((STDOUT, STDERR)):  # kineto's start and stop lines
                self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prof is None:
            return
        with native_output_silenced((STDOUT, STDERR)):
            self._prof.__exit__(None, None, None)
        events = self._prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")  # type: ignore[union-attr]
        for e in events:
            if e.name().startswith(_WINDOW):
                inside = [n for t, n in memory if e.start_ns() <= t <= e.end_ns()]
                level = peak = 0
                for n in inside:
                    level += n
                    peak = max(peak, level)
                self._result[e.name()[len(_WINDOW):]] = (level, peak)
        self._prof = None

    @contextlib.contextmanager
    def window(self, name: str) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            yield
            torch.cuda.synchronize(self.device)
            self._result[name] = (torch.cuda.memory_allocated(self.device) - before,
                                  torch.cuda.max_memory_allocated(self.device) - before)
        else:
            with torch.profiler.record_function(_WINDOW + name):
                yield

    def held(self, name: str) -> int:
        return max(0, self._result[name][0])

    def peak(self, name: str) -> int:
        return max(0, self._result[name][1])


@dataclass(frozen=True)
class Target:
    """What to profile: the pipeline's layers as the job builds them, its micro-batches and its loss."""

    layers: Sequence[Callable[[], torch.nn.Module]]  # e.g. DeepSpeed LayerSpec.build, in pipeline order
    batch: Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]]  # micro-batch size -> (input, labels)
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    model: ModelShape


@dataclass(frozen=True)
class Measurement:
    """How to profile: the micro-batch sizes, the training dtype, ``reps`` timed rounds (their median) after
    ``warmup`` rounds, and (GPUs) ``idle_seconds`` of the energy counter before any work for the idle power."""

    micro_batch_sizes: Sequence[int]
    dtype: str
    reps: int = 10
    warmup: int = 3
    idle_seconds: float = 2.0


@dataclass(frozen=True)
class _Bench:
    """What every layer of one profile is measured with: the measurement, the device, its unit timer, the hold
    (GPUs) and the unit calls an unchained layer's own ``backward()`` pays (``calls_s``)."""

    how: Measurement
    device: torch.device
    timer: UnitTimer
    hold: _DeviceHold | None
    calls_s: float
    power: _PowerMeter


def profile_layers(target: Target, how: Measurement, device: torch.device,
                   progress: Callable[[str], None] | None = None) -> LayerProfile:
    """Measure every layer of ``target`` at every micro-batch size (clocks untouched). On CPU the times are the
    runtime's simulated GPU's (``simulated_gpu_times``)."""
    dtype = how.dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    sizes = sorted(set(how.micro_batch_sizes))
    if not sizes or sizes[0] < 1 or how.reps < 1 or how.warmup < 0:
        raise ValueError("micro-batch sizes must be positive, reps >= 1 and warm-up >= 0")
    timer = UnitTimer(device)
    hold = _DeviceHold(device) if device.type == "cuda" else None
    power = _PowerMeter(device, how.idle_seconds)
    batches = {b: target.batch(b, device) for b in sizes}
    calls = _unit_calls(target, sizes, device, dtype)
    bench = _Bench(how, device, timer, hold, calls.backward_s, power)
    # floating inputs in the training dtype, as DeepSpeed loads them on the first stage
    inputs = {b: x.to(DTYPES[dtype]) if x.is_floating_point() else x for b, (x, _) in batches.items()}
    layers, flops = [], []
    last = len(target.layers) - 1
    with contextlib.closing(power):
        for i, build in enumerate(target.layers):
            with torch.device(device):  # built where it runs: no copy, and fast on GPUs
                module = build().to(dtype=DTYPES[dtype])
            loss = (lambda out, b: target.loss_fn(out, batches[b][1])) if i == last else None
            layer, layer_flops, inputs = _profile_layer(module, inputs, loss, bench)
            layers.append(layer)
            flops.append(layer_flops)
            if progress:
                progress(f"layer {i + 1}/{len(target.layers)} ({layer.name}) measured")
            del module
    del inputs  # the head's logits
    memory = _device_memory(device)
    if device.type == "cpu":
        layers = simulated_gpu_times(layers, flops)
    busy_w, by_size, idle_w, power_label = power.result(sizes)
    gpu, measured_mhz, clock_label = _clocks(device)
    return LayerProfile(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        cpu_threads=None if device.type == "cuda" else torch.get_num_threads(), dtype=dtype,
        date=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), gpu=gpu, measured_mhz=measured_mhz,
        clock_model=FrequencyModel.default().name, clock_label=clock_label, busy_power_w=busy_w,
        idle_power_w=idle_w, power_label=power_label, model=target.model, layers=tuple(layers),
        device_memory=memory, unit_calls=calls, busy_power_by_micro_batch_w=by_size)


def _device_memory(device: torch.device) -> DeviceMemory:
    """GPUs, with every layer freed: the workspaces still allocated, and what the device holds for this process
    outside the allocator (the device is this process's alone, as on the lent machines)."""
    if device.type != "cuda":
        return NO_DEVICE_MEMORY
    gc.collect()
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(total, total - free - torch.cuda.memory_reserved(device),
                        torch.cuda.memory_allocated(device),
                        "measured: cudaMemGetInfo and torch.cuda's allocator counters after profiling (the process "
                        "alone on its device)")


def _unit_calls(target: Target, sizes: Sequence[int], device: torch.device, dtype: str) -> UnitCalls:
    """GPUs: the host's cost of one backward() call and (bf16, where the profiler zeroes every layer's
    gradients) of one gradient zeroing, beyond their kernels, and the job's batch function per micro-batch
    size (see the module's docstring). CPU: none (the simulated GPU counts no host work)."""
    if device.type != "cuda":
        return UnitCalls(0.0, 0.0, {b: 0.0 for b in sizes}, "none: the CPU's simulated GPU counts no host work")
    w = torch.ones(16, device=device, requires_grad=True)
    a, b = torch.zeros(16, device=device), torch.zeros(16, device=device)

    def two_backwards() -> None:
        first, second = (w * 2.0).sum(), (w * 3.0).sum()
        first.backward()
        second.backward()

    def one_backward() -> None:
        torch.autograd.backward([(w * 2.0).sum(), (w * 3.0).sum()])

    def two_zeroings() -> None:
        torch._foreach_zero_([a])
        torch._foreach_zero_([b])

    def one_zeroing() -> None:
        torch._foreach_zero_([a, b])

    backward = _extra_host_s(two_backwards, one_backward, device)
    zero = _extra_host_s(two_zeroings, one_zeroing, device) if dtype == "bf16" else 0.0
    load = {size: statistics.median(_host_s(functools.partial(target.batch, size, device), device, synchronized=True)
                                    for _ in range(_CALL_REPS // 4)) for size in sizes}
    return UnitCalls(backward, zero, load, f"measured: host times, medians of {_CALL_REPS} (backward() of two roots "
                     "in two calls less in one; two tensors' gradient zeroing in two calls less in one) and of "
                     f"{_CALL_REPS // 4} (the job's batch function, the device synchronized at both ends)")


def _extra_host_s(more: Callable[[], object], fewer: Callable[[], object], device: torch.device) -> float:
    """How much longer the host takes for ``more`` than for ``fewer`` (medians, taken alternately, each on an
    idle device after a warm-up of both)."""
    more(), fewer()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(_CALL_REPS):
        for fn, out in zip((more, fewer), samples, strict=True):
            out.append(_host_s(fn, device))
    return max(0.0, statistics.median(samples[0]) - statistics.median(samples[1]))


def _host_s(fn: Callable[[], object], device: torch.device, synchronized: bool = False) -> float:
    """The host's time for ``fn`` from an idle device (to the device's end too if ``synchronized``)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    if synchronized:
        _sync(device)
    return time.perf_counter() - t0


Flops = dict[int, tuple[float, float]]  # micro-batch size -> (forward, backward) FLOPs of one layer


def simulated_gpu_times(layers: Sequence[Layer], flops: Sequence[Flops]) -> list[Layer]:
    """CPU: what the runtime's simulated GPU charges, by its one cost rule (envpipe.simgpu.cost): each unit's
    counted FLOPs at the nominal rate and each optimizer step's parameters at the nominal bandwidth, at the
    highest clock, whatever the CPU took."""
    out = []
    for layer, f in zip(layers, flops, strict=True):
        per = {b: replace(cost, forward_s=unit_s(f[b][0]), backward_s=unit_s(f[b][1]))
               for b, cost in layer.per_micro_batch.items()}
        out.append(replace(layer, per_micro_batch=per, optimizer_step_s=step_s(layer.parameters)))
    return out


def _profile_layer(module: torch.nn.Module, inputs: dict[int, torch.Tensor],
                   loss: Callable[[torch.Tensor, int], torch.Tensor] | None, bench: _Bench
                   ) -> tuple[Layer, Flops, dict[int, torch.Tensor]]:
    """One layer at every micro-batch size (``inputs``: size -> its input); returns it, its FLOPs per unit
    (CPU only, else 0) and its outputs. ``bench.calls_s``: the unit calls (GPUs), which an unchained layer's own
    ``backward()`` pays and the engine's stage pays once."""
    reps, warmup, timer = bench.how.reps, bench.how.warmup, bench.timer
    accumulator = _Accumulator(module) if bench.how.dtype == "bf16" else None
    work = _LayerWork(module, loss, bench.device, accumulator)
    units = {b: _Unit(work, x, b) for b, x in inputs.items()}
    if bench.hold is not None:
        times = {b: unit.time_on_gpu(reps, warmup, bench.hold, bench.calls_s) for b, unit in units.items()}
        flops = {b: (0.0, 0.0) for b in units}
        for b, unit in units.items():
            run, count = unit.power_rounds(times[b][4] + times[b][5])
            bench.power.measure(b, run, count * (times[b][0] + times[b][1]))
    else:
        measured = {b: unit.time(reps, warmup, timer) for b, unit in units.items()}
        times = {b: (f[0], bw[0], 0.0, 0.0, 0.0, 0.0) for b, (f, bw) in measured.items()}
        flops = {b: (f[1], bw[1]) for b, (f, bw) in measured.items()}
    optimizer = _Optimizer(module, accumulator)
    step_s = optimizer.time(reps, timer)
    with AllocationWindows(bench.device) as probe:  # one allocation probe per layer: all its windows
        outputs = {b: unit.probe(probe, str(b)) for b, unit in units.items()}
        with probe.window("step"):
            optimizer.step()
    # the head's output is the logits: never sent on, but the engine keeps them (envpipe.search.memory)
    per = {b: LayerCost(times[b][0], times[b][1], probe.held(f"{b}.forward"),
                        outputs[b].numel() * outputs[b].element_size(), probe.peak(f"{b}.forward"),
                        probe.peak(f"{b}.backward"), *times[b][2:]) for b in inputs}
    layer = Layer(type(module).__name__, optimizer.parameters, optimizer.param_bytes, optimizer.state_bytes(),
                  step_s, probe.peak("step"), per)
    return layer, flops, {b: out.detach() for b, out in outputs.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class UnitTimer:
    """What a unit costs on the device the job runs on, as (seconds, FLOPs). GPU: its wall time (synchronized).
    CPU: the training thread's CPU time (the wall time when torch computes with several threads) and, for units,
    the FLOPs of torch's FLOP counter, which the runtime's simulated GPU counts (``simulated_gpu_times`` turns
    them into its seconds)."""

    device: torch.device

    def __call__(self, fn: Callable[[], object], count_flops: bool = True) -> tuple[float, float]:
        counter = FlopCounterMode(display=False) if self.device.type == "cpu" and count_flops else None
        _sync(self.device)
        t0, c0 = time.perf_counter(), time.thread_time()
        if counter is not None:
            with counter:
                fn()
        else:
            fn()
        _sync(self.device)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        if self.device.type == "cuda":
            return wall, 0.0
        flops = float(counter.get_total_flops()) if counter is not None else 0.0
        return (cpu if torch.get_num_threads() == 1 else wall), flops


class _Accumulator:
    """bf16: DeepSpeed's BF16_Optimizer keeps the weights' gradients in a flat bf16 buffer (its default
    accumulation dtype), adding each micro-batch's gradients into it in one multi-tensor add, as the EnvPipe
    engine makes it do (envpipe.runtime.engine.hp_grads; profiles taken before 2026-11-29 timed DeepSpeed's own
    add one parameter at a time)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=torch.bfloat16,
                                device=self.params[0].device if self.params else None)
        self.views = _views(self.flat, self.params)

    def before_backward(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    def after_backward(self) -> None:
        present = [(view, p.grad) for view, p in zip(self.views, self.params, strict=True) if p.grad is not None]
        if present:
            torch._foreach_add_([view for view, _ in present], [grad.view(view.shape) for view, grad in present])


def _views(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's slice of a flat buffer, shaped like it."""
    out, at = [], 0
    for p in params:
        out.append(flat[at:at + p.numel()].view(p.shape))
        at += p.numel()
    return out


@dataclass(frozen=True)
class _LayerWork:
    """One layer as its units run it, at every micro-batch size: the module, the loss (the last layer's, else
    None), the device and the accumulator around every backward (bf16, else None)."""

    module: torch.nn.Module
    loss: Callable[[torch.Tensor, int], torch.Tensor] | None
    device: torch.device
    accumulator: _Accumulator | None


class _Unit:
    """One layer at one micro-batch size: its forward (the loss too on the last layer) and its backward
    (from the gradient the next stage would send, or from the loss), with the accumulator's work around it."""

    def __init__(self, work: _LayerWork, x: torch.Tensor, b: int) -> None:
        self.module, self.b, self.loss, self.device = work.module, b, work.loss, work.device
        self.x = x.detach().requires_grad_(True) if x.is_floating_point() else x.detach()
        self.accumulator = work.accumulator
        out, root = self.forward()
        self.grad = None if self.loss is not None else torch.randn_like(out)
        root.backward(self.grad)  # the weights' gradients exist from here on, as between micro-batches
        self.x.grad = None
        # its output can be its own input: the layer can be issued as a chain, as the engine issues a stage
        self.chainable = self.loss is None and out.shape == self.x.shape and out.dtype == self.x.dtype

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.module(self.x)
        return out, (self.loss(out, self.b) if self.loss is not None else out)

    def backward(self, root: torch.Tensor) -> None:
        if self.accumulator is not None:
            self.accumulator.before_backward()
        root.backward(self.grad)
        if self.accumulator is not None:
            self.accumulator.after_backward()
        self.x.grad = None

    def backward_all(self, roots: Sequence[torch.Tensor]) -> None:
        for root in roots:
            self.backward(root)

    def time(self, reps: int, warmup: int, timer: UnitTimer) -> tuple[tuple[float, float], tuple[float, float]]:
        """CPU: forward and backward (seconds, FLOPs) per unit, the median of ``reps`` rounds after ``warmup``."""
        for _ in range(warmup):
            self.backward(self.forward()[1])
        fwd, bwd = [], []
        held: list[torch.Tensor] = []  # the forward's root, for the backward
        for _ in range(reps):
            fwd.append(timer(lambda: held.append(self.forward()[1])))
            bwd.append(timer(lambda: self.backward_all(held)))
            held.clear()
        return ((statistics.median(t for t, _ in fwd), fwd[-1][1]), (statistics.median(t for t, _ in bwd), bwd[-1][1]))

    def time_on_gpu(self, reps: int, warmup: int, hold: _DeviceHold, calls_s: float) -> tuple[float, ...]:
        """GPU: per unit the device's forward and backward time, the host's, and the repeat times, each the
        median of ``reps`` repetitions (see the module's docstring); an unchained layer's backward host and
        repeat times without the unit calls (``calls_s``)."""
        round_of = self._chain_round if self.chainable else self._host_round
        for _ in range(max(warmup, 1)):
            self.backward(self.forward()[1])
            round_of(_QUEUE)
        hold_s, q = 0.0, _QUEUE
        samples = []
        for _ in range(reps):
            one, queue = round_of(1), round_of(q)
            hold_s = max(hold_s, 2 * (queue.issue_forward + queue.issue_backward) + 1e-3)
            for _ in range(_HOLD_TRIES):
                device, held = self._held_round(hold, hold_s)
                if held:
                    break
                hold_s *= 2  # the host was not done when the hold ended: once more, longer
            samples.append((*device, *host_and_repeat(one, queue, q)))
        fwd, bwd, fwd_host, bwd_host, fwd_repeat, bwd_repeat = (statistics.median(r[k] for r in samples)
                                                                for k in range(6))
        carried = 0.0 if self.chainable else calls_s
        return tuple(max(0.0, t) for t in (fwd, bwd, fwd_host, bwd_host - carried, fwd_repeat, bwd_repeat - carried))

    def power_rounds(self, unit_s: float) -> tuple[Callable[[], None], int]:
        """Free rounds back to back for about ``_POWER_WINDOW_S``, ``unit_s`` a unit's forward and backward
        repeat time: the device as the engine keeps it busy, for the energy counter; and how many units of each
        kind they run."""
        round_of = self._chain_round if self.chainable else self._host_round
        rounds = min(_MAX_POWER_ROUNDS, max(1, math.ceil(_POWER_WINDOW_S / max(_QUEUE * unit_s, 1e-9))))

        def run() -> None:
            for _ in range(rounds):
                round_of(_QUEUE)
        return run, rounds * _QUEUE

    def _held_round(self, hold: _DeviceHold, hold_s: float) -> tuple[tuple[float, float], bool]:
        """One round under a hold of ``hold_s``: the device's forward and backward time per unit, and whether
        the hold outlasted the host's issuing."""
        _sync(self.device)
        hold(hold_s)
        e0 = _event()
        roots = [self.forward()[1] for _ in range(_QUEUE)]
        e1 = _event()
        self.backward_all(roots)
        e2 = _event()
        held = not e0.query()  # the device still in the hold: it has all the units queued
        roots.clear()
        e2.synchronize()
        return (e0.elapsed_time(e1) / 1e3 / _QUEUE, e1.elapsed_time(e2) / 1e3 / _QUEUE), held

    def _host_round(self, units: int) -> HostRound:
        """One round of ``units`` units without a hold, the device running them as the host issues them."""
        _sync(self.device)
        t0 = time.perf_counter()
        roots = [self.forward()[1] for _ in range(units)]
        issued_f = time.perf_counter()
        _sync(self.device)
        t1 = time.perf_counter()
        self.backward_all(roots)
        issued_b = time.perf_counter()
        roots.clear()
        _sync(self.device)
        t2 = time.perf_counter()
        return HostRound(issued_f - t0, issued_b - t1, t1 - t0, t2 - t1)

    def _chain_round(self, units: int) -> HostRound:
        """One round of the layer applied ``units`` times in one forward pass and one backward() (with the
        optimizer's work per application), the device running them as the host issues them."""
        _sync(self.device)
        t0 = time.perf_counter()
        h = self.x
        for _ in range(units):
            h = self.module(h)
        issued_f = time.perf_counter()
        _sync(self.device)
        t1 = time.perf_counter()
        if self.accumulator is not None:
            self.accumulator.before_backward()
        h.backward(self.grad)
        if self.accumulator is not None:
            for _ in range(units):  # one layer's gradients added per application, as for a stage of them
                self.accumulator.after_backward()
        issued_b = time.perf_counter()
        del h
        self.x.grad = None
        _sync(self.device)
        t2 = time.perf_counter()
        return HostRound(issued_f - t0, issued_b - t1, t1 - t0, t2 - t1)

    def probe(self, probe: AllocationWindows, name: str) -> torch.Tensor:
        """One unit under the allocation probe (windows NAME.forward and NAME.backward); returns the output."""
        with probe.window(f"{name}.forward"):
            out, root = self.forward()
        with probe.window(f"{name}.backward"):
            self.backward(root)
        return out


class HostRound(NamedTuple):
    """A round of units without a hold: the host's time to issue the forwards and the backwards, and each
    one's span from the synchronization before it to the device's end (seconds)."""

    issue_forward: float
    issue_backward: float
    span_forward: float
    span_backward: float


def host_and_repeat(one: HostRound, queue: HostRound, units: int) -> tuple[float, float, float, float]:
    """Per unit: the host's forward and backward time and the forward and backward repeat time, each the
    difference of a round of ``units`` units and a round of one over ``units - 1``: what both rounds pay once
    cancels."""
    n = units - 1
    return ((queue.issue_forward - one.issue_forward) / n, (queue.issue_backward - one.issue_backward) / n,
            (queue.span_forward - one.span_forward) / n, (queue.span_backward - one.span_backward) / n)


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class _DeviceHold:
    """Keeps the GPU busy for a while (torch.cuda._sleep, a spin kernel of a number of clock cycles), its cycles
    per second measured once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # the first launch loads the kernel
        _sync(device)
        start = _event()
        torch.cuda._sleep(cycles)
        end = _event()
        end.synchronize()
        self.cycles_per_s = cycles / (start.elapsed_time(end) / 1e3)

    def __call__(self, seconds: float) -> None:
        torch.cuda._sleep(int(seconds * self.cycles_per_s))


class _Optimizer:
    """One optimizer step of a layer as DeepSpeed takes it: torch AdamW (the example's optimizer) on the fp32
    weights, or, for bf16, as DeepSpeed's BF16_Optimizer does: the norm of every gradient (in fp32, one at a
    time), the flat bf16 gradient buffer cast to fp32 for AdamW on the flat fp32 master weights, the weights
    copied back, the buffer zeroed. The layer's gradients must exist."""

    def __init__(self, module: torch.nn.Module, accumulator: _Accumulator | None) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.accumulator = accumulator
        self.parameters = sum(p.numel() for p in self.params)
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.master: torch.Tensor | None = None
        if accumulator is not None and self.params:
            self.master = torch.cat([p.detach().float().flatten() for p in self.params]).requires_grad_(True)
            self.opt: torch.optim.Optimizer | None = torch.optim.AdamW([self.master], lr=1e-4)
        else:
            self.opt = torch.optim.AdamW(self.params, lr=1e-4) if self.params else None
        self.step()  # creates the optimizer state

    def step(self) -> None:
        if self.opt is None:
            return
        if self.master is None or self.accumulator is None:
            self.opt.step()
            return
        torch.stack([g.float().norm() for g in self.accumulator.views]).norm()
        self.master.grad = self.accumulator.flat.float()
        self.opt.step()
        self.master.grad = None
        with torch.no_grad():
            torch._foreach_copy_(list[torch.Tensor](self.params), _views(self.master, self.params))
        self.accumulator.flat.zero_()

    def time(self, reps: int, timer: UnitTimer) -> float:
        """Median seconds of a step, synchronized (on CPU ``simulated_gpu_times`` charges the simulated GPU's)."""
        return statistics.median(timer(self.step, count_flops=False)[0] for _ in range(reps)) if self.opt else 0.0

    def state_bytes(self) -> int:
        """The optimizer's state (AdamW moments) and, for bf16, the fp32 master weights."""
        if self.opt is None:
            return 0
        state = sum(t.numel() * t.element_size() for s in self.opt.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor) and t.dim() > 0)
        if self.master is not None:
            state += self.master.numel() * self.master.element_size()
        return state


class _PowerMeter:
    """GPU: idle power before any work, busy power per micro-batch size over the device running units (NVML
    counter, read-only). CPU: the simulated GPU's powers (frequency model)."""

    def __init__(self, device: torch.device, idle_seconds: float) -> None:
        self.device = device
        # micro-batch size -> (joules, seconds, seconds the device computed: its units' device times)
        self._busy: dict[int, tuple[float, float, float]] = {}
        self._idle_w: float | None = None
        self._read: Callable[[], float] | None = None
        if device.type == "cuda":
            self._read, self._close = nvml_reader(nvml_id(device.index or 0))
            e0, t0 = self._read(), time.perf_counter()
            time.sleep(idle_seconds)
            self._idle_w = (self._read() - e0) / (time.perf_counter() - t0)

    def close(self) -> None:
        """Give back the NVML reader (GPUs; the counts stay)."""
        if self._read is not None:
            self._read = None
            self._close()

    def measure(self, micro_batch: int, work: Callable[[], None], device_s: float) -> None:
        """Count ``work``'s energy and time (the device synchronized around it) towards ``micro_batch``'s power;
        ``device_s``: how long the device computes in it (its units' device times)."""
        if self._read is None:
            return
        _sync(self.device)
        e0, t0 = self._read(), time.perf_counter()
        work()
        _sync(self.device)
        joules, seconds, computing = self._busy.get(micro_batch, (0.0, 0.0, 0.0))
        self._busy[micro_batch] = (joules + self._read() - e0, seconds + time.perf_counter() - t0,
                                   computing + device_s)

    def result(self, sizes: Sequence[int]) -> tuple[float, dict[int, float] | None, float, str]:
        """(busy power, busy power per micro-batch size, idle power, label): the busy power is the device's
        while it computes, its energy less the idle power over the rest of the time, over its computing time."""
        if self._idle_w is None:
            model = FrequencyModel.default()
            return (model.busy_power(model.max_mhz), None, model.idle_power_w,
                    f"simulated: {model.name} frequency model (no GPU)")
        idle = self._idle_w

        def computing_w(joules: float, seconds: float, computing: float) -> float:
            computing = min(computing, seconds)
            return max(idle, (joules - idle * (seconds - computing)) / computing) if computing > 0 else idle

        total = tuple(sum(v[k] for v in self._busy.values()) for k in range(3))
        return (computing_w(*total), {b: computing_w(*self._busy[b]) for b in sizes}, idle,
                f"measured: NVML energy counter (busy: while the device computes, every layer's units run back to "
                f"back for about {_POWER_WINDOW_S:g} s per layer and micro-batch size, the idle power charged to "
                f"the rest of that time; idle: before any work)")


def _clocks(device: torch.device) -> tuple[str, int | None, str]:
    """(candidate-clock rule, the clock the times stand for, label)."""
    model = FrequencyModel.default()
    if device.type != "cuda":
        return ("a100", None, f"CPU: the runtime's simulated GPU (a unit lasts its FLOPs at the CPU's rate) at its "
                f"highest clock ({model.max_mhz} MHz); other clocks simulated by the frequency model")
    name = torch.cuda.get_device_name(device).lower()
    gpu = next((key for key in GPU_FILTERS if key in name), "all")
    top = GPU_FILTERS[gpu].max_mhz if gpu in GPU_FILTERS else None
    return (gpu, top, "measured at the GPU's default clocks (never changed; the GPU boosts and caps itself), "
            "taken as its highest clock; lower clocks simulated by the frequency model")

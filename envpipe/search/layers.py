"""The per-layer profile: what one pipeline layer costs, per micro-batch size (a versioned JSON file).

Written by the layer profiler (envpipe.layerprof.profiler, torch) and read by the search (pure):

    {"version": 4, "kind": "envpipe-layer-profile",
     "device": "NVIDIA H200", "cpu_threads": null, "dtype": "bf16", "date": "2026-11-23T10:00:00Z",
     "clocks": {"gpu": "h200", "measured_mhz": 1980, "model": "sim-a100", "label": "..."},
     "power": {"busy_w": 650.0, "idle_w": 123.0, "busy_w_by_micro_batch": {"1": 480.0, ...},
               "label": "measured ..."},
     "device_memory": {"total_bytes": 150083813376, "outside_allocator_bytes": 553648128,
                       "workspace_bytes": 75497472, "label": "measured ..."},
     "unit_calls": {"backward_call_s": 0.0002, "grad_zero_call_s": 0.00002, "load_s": {"1": 0.0004, ...},
                    "label": "measured ..."},
     "model": {"family": "gpt2", "layers": 16, "hidden": 2048, "heads": 16, "seq": 1024, "vocab": 50304},
     "micro_batch_sizes": [1, 2, 4],
     "layers": [{"name": "Embedding", "parameters": 103M, "param_bytes": ..., "optimizer_state_bytes": ...,
                 "optimizer_step_s": ..., "optimizer_step_peak_bytes": ...,
                 "per_micro_batch": {"1": {"forward_s": ..., "backward_s": ..., "forward_host_s": ...,
                                           "backward_host_s": ..., "forward_repeat_s": ...,
                                           "backward_repeat_s": ..., "activation_bytes": ...,
                                           "output_bytes": ..., "forward_peak_bytes": ...,
                                           "backward_peak_bytes": ...}, ...}}, ...]}

``cpu_threads``: on CPU, the threads torch computed with (a job must run its processes with as many to see
the same times); null on GPUs. On CPU the times are the runtime's simulated GPU's (a unit lasts its
FLOPs at the CPU's rate, envpipe.runtime.clocks.SimClock). Times are measured at the device's current
clock (GPUs: clocks never changed); the other clocks of a stage profile built from this file come from
the frequency model (``clocks.model``) and are simulated.

Time per layer and micro-batch, in three numbers (envpipe.search.timing puts them together as the engine
runs them): forward_s / backward_s, the device's own time for the unit when its work is queued back to
back; forward_host_s / backward_host_s, the host's time to issue it (Python, launches); and
forward_repeat_s / backward_repeat_s, the time per unit when the layer's units run back to back with the
device behind the host, as the engine runs them: at least the larger of the other two, more where host and
device cannot overlap within the layer. A narrow layer at a small micro-batch takes the host longer than the
device: it is launch-bound. On CPU (a simulated GPU that only counts work) the host and repeat times are 0.
Version 3 takes the repeat time as the difference of rounds of 4 and of 1 units (over 3), so that a round's
edges (its first launch, its final synchronization) are not charged to every unit; versions 1 and 2 took a
round of 4 over 4. Version 4 takes the host and repeat times of a layer as the engine issues it, inside a
chain: one forward pass and one ``backward()`` over the layer applied 4 times and once, the difference over
3. Its backward host and repeat times carry no unit calls (below): the stage pays them once. Version 3 times
carried one of each per layer; they are read without them (the unit calls subtracted), so that both versions
mean the same.

Unit calls (version 3 on, GPUs; 0 on CPU and in older versions): host work the engine pays once per
micro-batch and stage, measured once, and what the engine adds to every forward unit.
backward_call_s: one ``backward()`` call beyond its kernels (the profiler calls it per layer, the engine once
over the stage); grad_zero_call_s: one call zeroing the gradients beyond its kernels (bf16: the profiler
zeroes each layer's, DeepSpeed's BF16_Optimizer all of the stage's at once; 0 where the profiler zeroes
none); load_s: per micro-batch size, the job's batch function (the micro-batch's load, its copy to the device
included), which the engine runs before each forward on the stages that read data (the first and the last).

Device memory (GPUs; on CPU all 0 and total null): the device's total, what the process holds outside
the caching allocator (CUDA context, library handles, kernel images), and the workspaces that stay
allocated once the first matrix products and their backward ran (cuBLAS, per stream and thread).
Memory per layer and micro-batch (bytes of the allocator: torch.cuda on GPUs, torch's CPU allocator
through the profiler's memory events on CPU):

- activation_bytes: held from the end of the layer's forward until its backward (what autograd saves,
  and the output);
- output_bytes: the activation the layer passes on (to the next stage when a cut follows it);
- forward_peak_bytes / backward_peak_bytes: the transient peak above what was held before the forward /
  the backward (workspace, gradients of activations);
- output_bytes of the last layer (the head) is its output, the logits: never sent, but DeepSpeed's
  pipeline engine keeps the last stage's outputs in its pipe buffers (envpipe.search.memory);
- parameters, param_bytes: the layer's weights in the training dtype; optimizer_state_bytes: the
  optimizer's state (AdamW on fp32 master weights); optimizer_step_s and optimizer_step_peak_bytes: one
  optimizer step of the layer (time, transient memory).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from envpipe.atomicfile import atomic_write
from envpipe.limits import MAX_CLOCK_MHZ, MAX_POWER_W, MAX_UNIT_TIME_S, parse_json, quote, range_error, read_text

LAYER_PROFILE_VERSION = 4
# 1: no host or repeat times (taken as 0), no device memory; 1-2: no unit calls; 3: unit calls in every backward
READABLE_VERSIONS = (1, 2, 3, 4)
KIND = "envpipe-layer-profile"
DTYPES = ("fp32", "bf16")
FAMILIES = ("gpt2", "llama")
MODEL_KEYS = ("family", "layers", "hidden", "heads", "seq", "vocab")  # ModelShape's fields, as JSON keys
_PER_MB_KEYS = ("forward_s", "backward_s", "activation_bytes", "output_bytes", "forward_peak_bytes",
                "backward_peak_bytes", "forward_host_s", "backward_host_s", "forward_repeat_s", "backward_repeat_s")
_MEMORY_KEYS = ("outside_allocator_bytes", "workspace_bytes")
# bounds far outside real models: no file can make the search allocate gigabytes or overflow to inf
MAX_LAYER_PROFILE_BYTES = 16 * 2**20  # a 1,000-layer profile with 8 micro-batch sizes takes about 4 MiB
MAX_BYTES = 2**50  # 1 PiB: any byte count
MAX_PARAMETERS = 2**45
MAX_MODEL = {"layers": 4094, "hidden": 2**20, "heads": 2**16, "seq": 2**24, "vocab": 2**24}
MAX_SIZES = 16  # micro-batch sizes in one profile
MAX_MICRO_BATCH = 65_536
MAX_THREADS = 4096
MAX_STRING = 1000
_LAYER_KEYS = ("parameters", "param_bytes", "optimizer_state_bytes", "optimizer_step_s", "optimizer_step_peak_bytes")


class LayerProfileError(ValueError):
    """A malformed layer profile; the message names the file, where in it, and why."""


@dataclass(frozen=True)
class LayerCost:
    """One layer at one micro-batch size."""

    forward_s: float
    backward_s: float
    activation_bytes: int
    output_bytes: int
    forward_peak_bytes: int
    backward_peak_bytes: int
    forward_host_s: float = 0.0  # the host's time to issue the unit (0: never launch-bound, e.g. on CPU)
    backward_host_s: float = 0.0
    forward_repeat_s: float = 0.0  # per unit, the layer's units back to back (0: not measured, e.g. on CPU)
    backward_repeat_s: float = 0.0


@dataclass(frozen=True)
class DeviceMemory:
    """What a training process holds on its device besides its tensors (see the module's docstring)."""

    total_bytes: int | None  # None: unknown (CPU)
    outside_allocator_bytes: int
    workspace_bytes: int
    label: str

    def to_json(self) -> dict[str, Any]:
        return {"total_bytes": self.total_bytes, **{k: getattr(self, k) for k in _MEMORY_KEYS}, "label": self.label}


NO_DEVICE_MEMORY = DeviceMemory(None, 0, 0, "none: a CPU, or a version 1 profile")


@dataclass(frozen=True)
class UnitCalls:
    """Host work per unit that the engine pays once per micro-batch and stage, and its load of a micro-batch
    (see the module's docstring)."""

    backward_call_s: float
    grad_zero_call_s: float
    load_s: dict[int, float]  # micro-batch size -> seconds (a size not in it: 0)
    label: str

    @property
    def backward_s(self) -> float:
        """The host's calls a stage's backward unit pays once, whatever its layers."""
        return self.backward_call_s + self.grad_zero_call_s

    def load(self, micro_batch: int) -> float:
        return self.load_s.get(micro_batch, 0.0)

    def to_json(self, sizes: Sequence[int]) -> dict[str, Any]:
        return {"backward_call_s": self.backward_call_s, "grad_zero_call_s": self.grad_zero_call_s,
                "load_s": {str(b): self.load(b) for b in sizes}, "label": self.label}


NO_UNIT_CALLS = UnitCalls(0.0, 0.0, {}, "none: a CPU (a simulated GPU counts no host work), or a version 1 or 2 "
                          "profile")


@dataclass(frozen=True)
class Layer:
    name: str
    parameters: int
    param_bytes: int
    optimizer_state_bytes: int
    optimizer_step_s: float
    optimizer_step_peak_bytes: int
    per_micro_batch: dict[int, LayerCost]


@dataclass(frozen=True)
class ModelShape:
    """The model the profile was measured on: enough to build it again (examples/train_gpt.py)."""

    family: str
    layers: int  # transformer blocks; the pipeline has layers + 2 (embedding, head)
    hidden: int
    heads: int
    seq: int
    vocab: int

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in MODEL_KEYS}


@dataclass(frozen=True)
class LayerProfile:
    device: str
    cpu_threads: int | None  # CPU: torch's threads during the measurement; None on GPUs
    dtype: str
    date: str
    gpu: str  # candidate-clock rule (envpipe.profile.gpus): the GPU's own, or the simulated GPU's on CPU
    measured_mhz: int | None  # the clock the times were measured at (None: a CPU, no SM clock)
    clock_model: str  # frequency model that gives the other clocks (simulated)
    clock_label: str
    busy_power_w: float
    idle_power_w: float
    power_label: str
    model: ModelShape
    layers: tuple[Layer, ...]
    device_memory: DeviceMemory = NO_DEVICE_MEMORY
    unit_calls: UnitCalls = NO_UNIT_CALLS
    source: str = "<memory>"
    # the device's power running the layers' units at each micro-batch size (profiles before 2026-11-29 21:00 UTC
    # have none: one busy power, over the whole profiling, its idle gaps included)
    busy_power_by_micro_batch_w: dict[int, float] | None = None

    def busy_power_at(self, micro_batch: int) -> float:
        """The device's power while it runs the units of ``micro_batch`` (the profile's one where it has no
        power per size)."""
        if self.busy_power_by_micro_batch_w is None:
            return self.busy_power_w
        return self.busy_power_by_micro_batch_w[micro_batch]

    @property
    def micro_batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.layers[0].per_micro_batch))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": LAYER_PROFILE_VERSION,
            "kind": KIND,
            "device": self.device,
            "cpu_threads": self.cpu_threads,
            "dtype": self.dtype,
            "date": self.date,
            "clocks": {"gpu": self.gpu, "measured_mhz": self.measured_mhz, "model": self.clock_model,
                       "label": self.clock_label},
            "power": {"busy_w": self.busy_power_w, "idle_w": self.idle_power_w, "label": self.power_label,
                      **({} if self.busy_power_by_micro_batch_w is None else {"busy_w_by_micro_batch": {
                          str(b): w for b, w in sorted(self.busy_power_by_micro_batch_w.items())}})},
            "device_memory": self.device_memory.to_json(),
            "unit_calls": self.unit_calls.to_json(self.micro_batch_sizes),
            "model": self.model.to_json(),
            "micro_batch_sizes": list(self.micro_batch_sizes),
            "layers": [
                {"name": layer.name, **{k: getattr(layer, k) for k in _LAYER_KEYS},
                 "per_micro_batch": {str(b): {k: getattr(c, k) for k in _PER_MB_KEYS}
                                     for b, c in sorted(layer.per_micro_batch.items())}}
                for layer in self.layers
            ],
        }

    def save(self, path: str | Path) -> None:
        with atomic_write(path) as fh:  # never a torn profile; a FIFO or device there is replaced, not written
            fh.write(json.dumps(self.to_json(), indent=1) + "\n")


def load_layer_profile(path: str | Path) -> LayerProfile:
    """Read and validate a layer profile; LayerProfileError names the file and the first problem. A regular
    file of at most MAX_LAYER_PROFILE_BYTES, finite numbers within the bounds below (envpipe.limits)."""
    try:
        data = parse_json(read_text(path, MAX_LAYER_PROFILE_BYTES, "layer profile"))
    except OSError as exc:
        raise LayerProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise LayerProfileError(f"{path}: {exc}") from None
    try:
        return _from_json(data, str(path))
    except LayerProfileError as exc:
        raise LayerProfileError(f"{path}: {exc}") from None


def _from_json(data: Any, source: str) -> LayerProfile:
    top = _object(data, "the profile")
    if top.get("kind") != KIND:
        raise LayerProfileError(f"'kind' must be {KIND!r}, got {quote(top.get('kind'))} (a stage profile CSV is "
                                "another format: `envpipe plan --profile`)")
    version = top.get("version")
    if not _is_int(version) or version not in READABLE_VERSIONS:
        raise LayerProfileError(f"unsupported layer profile version {quote(version)} "
                                f"(this tool reads {', '.join(map(str, READABLE_VERSIONS))})")
    dtype = _string(top, "dtype", "'dtype'")
    if dtype not in DTYPES:
        raise LayerProfileError(f"'dtype' must be one of {', '.join(DTYPES)}, got {quote(dtype)}")
    clocks = _object(top.get("clocks"), "'clocks'")
    power = _object(top.get("power"), "'power'")
    model = _object(top.get("model"), "'model'")
    family = _string(model, "family", "'model.family'")
    if family not in FAMILIES:
        raise LayerProfileError(f"'model.family' must be one of {', '.join(FAMILIES)}, got {quote(family)}")
    shape = ModelShape(family, *(_count(model, k, f"'model.{k}'", 1, MAX_MODEL[k]) for k in MODEL_KEYS[1:]))
    sizes = top.get("micro_batch_sizes")
    if (not isinstance(sizes, list) or not 0 < len(sizes) <= MAX_SIZES
            or any(not _is_int(b) or not 1 <= b <= MAX_MICRO_BATCH for b in sizes) or len(set(sizes)) != len(sizes)):
        raise LayerProfileError(f"'micro_batch_sizes' must be a list of 1 to {MAX_SIZES} different integers in "
                                f"[1, {MAX_MICRO_BATCH}]")
    raw_layers = top.get("layers")
    if not isinstance(raw_layers, list) or len(raw_layers) != shape.layers + 2:
        count = len(raw_layers) if isinstance(raw_layers, list) else "no list of"
        raise LayerProfileError(f"{count} layers for a model of {shape.layers} blocks: expected "
                                f"{shape.layers + 2} (embedding, blocks, head)")
    calls = _unit_calls(top, sorted(sizes)) if version >= 3 else NO_UNIT_CALLS
    # version 3: every layer's backward carried the stage's calls once (see the module's docstring)
    carried = calls.backward_s if version == 3 else 0.0
    layers = tuple(_layer(raw, i, sorted(sizes), version, carried) for i, raw in enumerate(raw_layers))
    threads = top.get("cpu_threads")
    if threads is not None and (not _is_int(threads) or not 1 <= threads <= MAX_THREADS):
        raise LayerProfileError(f"'cpu_threads' must be an integer in [1, {MAX_THREADS}] or null, got {quote(threads)}")
    measured = clocks.get("measured_mhz")
    if measured is not None and (not _is_int(measured) or not 1 <= measured <= MAX_CLOCK_MHZ):
        raise LayerProfileError(f"'clocks.measured_mhz' must be an integer in [1, {MAX_CLOCK_MHZ}] or null, got "
                                f"{quote(measured)}")
    return LayerProfile(
        device=_string(top, "device", "'device'"), cpu_threads=threads, dtype=dtype,
        date=_string(top, "date", "'date'"),
        gpu=_string(clocks, "gpu", "'clocks.gpu'"), measured_mhz=measured,
        clock_model=_string(clocks, "model", "'clocks.model'"), clock_label=_string(clocks, "label", "'clocks.label'"),
        busy_power_w=_number(power, "busy_w", "'power.busy_w'", MAX_POWER_W, positive=True),
        idle_power_w=_number(power, "idle_w", "'power.idle_w'", MAX_POWER_W),
        power_label=_string(power, "label", "'power.label'"), model=shape, layers=layers,
        device_memory=_device_memory(top) if version >= 2 else NO_DEVICE_MEMORY,
        unit_calls=calls, source=source, busy_power_by_micro_batch_w=_power_by_size(power, sorted(sizes)))


def _power_by_size(power: dict[str, Any], sizes: list[int]) -> dict[int, float] | None:
    """The optional busy power per micro-batch size: one positive number for each of the profile's sizes."""
    if "busy_w_by_micro_batch" not in power:
        return None
    raw = _object(power["busy_w_by_micro_batch"], "'power.busy_w_by_micro_batch'")
    if sorted(raw) != sorted(str(b) for b in sizes):
        raise LayerProfileError("'power.busy_w_by_micro_batch' must have one entry per micro-batch size, "
                                f"{', '.join(map(str, sizes))}")
    return {b: _number(raw, str(b), f"'power.busy_w_by_micro_batch.{b}'", MAX_POWER_W, positive=True) for b in sizes}


def _device_memory(top: dict[str, Any]) -> DeviceMemory:
    raw = _object(top.get("device_memory"), "'device_memory'")
    total = raw.get("total_bytes")
    if total is not None and (not _is_int(total) or not 1 <= total <= MAX_BYTES):
        raise LayerProfileError(f"'device_memory.total_bytes' must be an integer in [1, {MAX_BYTES}] or null, got "
                                f"{quote(total)}")
    outside, workspace = (_count(raw, k, f"'device_memory.{k}'") for k in _MEMORY_KEYS)
    return DeviceMemory(total, outside, workspace, _string(raw, "label", "'device_memory.label'"))


def _unit_calls(top: dict[str, Any], sizes: list[int]) -> UnitCalls:
    raw = _object(top.get("unit_calls"), "'unit_calls'")
    backward, zero = (_number(raw, k, f"'unit_calls.{k}'", MAX_UNIT_TIME_S) for k in ("backward_call_s",
                                                                                    "grad_zero_call_s"))
    loads = _object(raw.get("load_s"), "'unit_calls.load_s'")
    if sorted(loads) != sorted(str(b) for b in sizes):
        raise LayerProfileError(f"'unit_calls.load_s' has sizes {quote(sorted(loads))}, expected {sizes} "
                                "(micro_batch_sizes)")
    load = {b: _number(loads, str(b), f"'unit_calls.load_s' of micro-batch {b}", MAX_UNIT_TIME_S) for b in sizes}
    return UnitCalls(backward, zero, load, _string(raw, "label", "'unit_calls.label'"))


def _layer(raw: Any, index: int, sizes: list[int], version: int, carried_calls_s: float) -> Layer:
    where = f"layer {index}"
    obj = _object(raw, where)
    per_raw = _object(obj.get("per_micro_batch"), f"{where}: 'per_micro_batch'")
    if sorted(per_raw) != sorted(str(b) for b in sizes):
        raise LayerProfileError(f"{where}: 'per_micro_batch' has sizes {quote(sorted(per_raw))}, expected {sizes} "
                                "(micro_batch_sizes)")
    per: dict[int, LayerCost] = {}
    for b in sizes:
        at = f"{where} micro-batch {b}"
        cell = _object(per_raw[str(b)], at)
        forward, backward = (_number(cell, k, f"{at}: '{k}'", MAX_UNIT_TIME_S, positive=True)
                             for k in _PER_MB_KEYS[:2])
        # a layer always keeps something for its backward (its input, at least): 0 bytes is no measurement
        held = _count(cell, "activation_bytes", f"{at}: 'activation_bytes'", minimum=1)
        output, forward_peak, backward_peak = (_count(cell, k, f"{at}: '{k}'") for k in _PER_MB_KEYS[3:6])
        forward_host, backward_host, forward_repeat, backward_repeat = (
            _number(cell, k, f"{at}: '{k}'", MAX_UNIT_TIME_S) if version >= 2 else 0.0 for k in _PER_MB_KEYS[6:])
        per[b] = LayerCost(forward, backward, held, output, forward_peak, backward_peak, forward_host,
                           max(0.0, backward_host - carried_calls_s), forward_repeat,
                           max(0.0, backward_repeat - carried_calls_s))
    parameters = _count(obj, "parameters", f"{where}: 'parameters'", maximum=MAX_PARAMETERS)
    param_bytes, state_bytes, step_peak = (_count(obj, k, f"{where}: '{k}'")
                                           for k in ("param_bytes", "optimizer_state_bytes",
                                                     "optimizer_step_peak_bytes"))
    return Layer(_string(obj, "name", f"{where}: 'name'"), parameters, param_bytes, state_bytes,
                 _number(obj, "optimizer_step_s", f"{where}: 'optimizer_step_s'", MAX_UNIT_TIME_S), step_peak, per)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LayerProfileError(f"{what} must be a JSON object")
    return value


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _string(obj: dict[str, Any], key: str, label: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_STRING:
        raise LayerProfileError(f"{label} must be a string of 1 to {MAX_STRING} characters, got {quote(value)}")
    return value


def _count(obj: dict[str, Any], key: str, label: str, minimum: int = 0, maximum: int = MAX_BYTES) -> int:
    value = obj.get(key)
    if not _is_int(value) or not minimum <= value <= maximum:
        raise LayerProfileError(f"{label} must be an integer in [{minimum}, {maximum}], got {quote(value)}")
    return value


def _number(obj: dict[str, Any], key: str, label: str, maximum: float, positive: bool = False) -> float:
    value = obj.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise LayerProfileError(f"{label} must be a number, got {quote(value)}")
    reason = range_error(float(value), 0.0, maximum, low_open=positive)
    if reason:
        raise LayerProfileError(f"{label} {reason}")
    return float(value)

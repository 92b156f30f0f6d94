"""What DeepSpeed's pipeline engine adds, on a GPU, to the layers' own time and memory that the layer profile
measures one layer at a time.

Time: the engine's host work before each forward's layers beyond the micro-batch's load (its instructions, the
synchronization before the forward: envpipe.search.timing), once per iteration its work around the units and the
optimizer step (the loss's aggregation, the end of the schedule), and how the host's time for a layer inside the
engine's stage loop compares with the profile's (``host_scale``). Since version 3 the profile measures what the
engine does once per micro-batch and the profiler once per layer (``UnitCalls``), and the micro-batch's load, so
that these are 0, 0 and 1 unless a fit says otherwise. The optimizer step, where a fit gives it
(``step_per_parameter_s``): DeepSpeed's optimizer steps one flat partition of the stage's weights, so its time is
per parameter, with the engine's work per iteration (``iteration_s``) beside it; the profile's per-layer step
times, each layer stepped on its own, add one layer's fixed costs per layer (on one H200, 2026-11-29, they summed
to well above the measured step of a model of many narrow layers and below that of one of few wide ones: the runs
of benchmarks/results/search_accuracy_call6.md). Without it (files fitted before it existed) the search sums the
profile's. How much the host's speed wanders on the machine (``host_spread``): the fraction by which a run's host
times may be above or below the fitted ones (the host's clock, other processes, the hypervisor), so that a
configuration the host sets the pace of has a band of times rather than one (envpipe.search.band).

Memory: the caching allocator's fragmentation, the memory it holds that it can neither reuse for a new
block nor give back (split blocks partly in use, torch's `inactive_split_bytes`), over its allocated peak,
with the allocator setting the found configuration trains with (``allocator``: PYTORCH_CUDA_ALLOC_CONF);
and what the training process holds outside the allocator beyond the profile's CUDA context (NCCL's
communicators and buffers). Not the allocator's reserved peak: what it reserves beyond its allocations
is mostly a cache of free blocks, which it releases and retries before it would run out of memory (it
grows where memory is plentiful: 4 to 39 % above the allocated peak in the fit runs), so it says what was
free, not what was needed.

These few numbers are properties of the engine and the host, not of a model: they are fitted once on
declared configurations (benchmarks/search_fit.py over runs of benchmarks/search_accuracy.py: the fit set,
never the configurations the accuracy is scored on), kept in a small JSON file (``--engine-model`` of
`envpipe search`: fit your own host's), and the committed fit is the default below, checked by a test. On
the CPU's simulated GPU (virtual time, no launches, torch's CPU allocator) there is nothing to add.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envpipe.limits import parse_json, quote, read_text
from envpipe.search.layers import LayerProfile
from envpipe.search.memory import DeviceOverhead

ENGINE_MODEL_VERSION = 1
EXPANDABLE = "expandable_segments:True"
_BOUNDS = {"unit_host_s": (0.0, 1.0), "iteration_s": (0.0, 60.0), "host_scale": (0.0, 10.0),
           "fragmentation": (0.0, 10.0), "outside_allocator_bytes": (0, 2**40)}
_OPTIONAL = {"host_spread": (0.0, 0.9),  # absent in files fitted before it existed: 0, no band
             "step_per_parameter_s": (0.0, 1e-6)}  # absent: the profile's per-layer optimizer step times


class EngineModelError(ValueError):
    """A malformed engine model file; the message names the file and why."""


@dataclass(frozen=True)
class EngineModel:
    unit_host_s: float  # host work before each forward unit's layers
    iteration_s: float  # per iteration, besides the units and the optimizer step
    host_scale: float  # the host's time for a layer in the engine's stage loop over the profile's
    fragmentation: float  # what the allocator can neither reuse nor give back, over its allocated peak
    outside_allocator_bytes: int  # beyond the profile's: NCCL's communicators and buffers
    allocator: str  # the PYTORCH_CUDA_ALLOC_CONF the numbers hold for ("" = torch's default)
    label: str
    host_spread: float = 0.0  # the host's times may be this fraction above or below the fitted ones
    step_per_parameter_s: float | None = None  # the optimizer step per parameter (None: the profile's step times)

    def to_json(self) -> dict[str, Any]:
        return {"version": ENGINE_MODEL_VERSION, **{k: v for k, v in asdict(self).items() if v is not None}}


SIMULATED_GPU = EngineModel(0.0, 0.0, 1.0, 0.0, 0, "", "none: the CPU's simulated GPU (virtual time, torch's CPU "
                            "allocator)")

# benchmarks/results/search_accuracy/call5/engine.json: benchmarks/search_fit.py on the call4 runs (one H100,
# 2026-11-25; layer profiles version 4, time and memory terms), held out on call5's
# (benchmarks/results/search_accuracy_call4.md); tests/benchmarks/test_search_accuracy.py refits it from the committed
# runs and compares. Its host scale is for version 4 profiles (a layer timed inside a chain of itself).
# The host spread came later: the same fit on the same runs (the file reads as spread 0).
GPU = EngineModel(0.0, 0.0, 1.22, 0.0, 1_002_438_656, EXPANDABLE,
                  "fitted 2026-11-25 by benchmarks/search_fit.py on 8 runs of gpt2_20x1280_s1024, llama_16x2048_s1024 "
                  "(NVIDIA H100 80GB HBM3, allocator expandable_segments:True)", host_spread=0.116)


def engine_model(layers: LayerProfile) -> EngineModel:
    return SIMULATED_GPU if layers.device == "cpu" else GPU


def device_overhead(layers: LayerProfile, engine: EngineModel, communicator_bytes: int = 0) -> DeviceOverhead:
    """The device memory a training process needs besides its allocated peak (envpipe.search.memory), with
    ``communicator_bytes`` of its communicators with other ranks (envpipe.search.cluster)."""
    measured = layers.device_memory
    return DeviceOverhead(measured.workspace_bytes, engine.fragmentation,
                          measured.outside_allocator_bytes + engine.outside_allocator_bytes + communicator_bytes)


def load_engine_model(path: str | Path) -> EngineModel:
    """An engine model file (benchmarks/search_fit.py's output); EngineModelError names the file and the problem."""
    try:
        data = parse_json(read_text(path, 1 << 20, "engine model"))
    except OSError as exc:
        raise EngineModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise EngineModelError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != ENGINE_MODEL_VERSION:
        raise EngineModelError(f"{path}: not an engine model (a JSON object with \"version\": {ENGINE_MODEL_VERSION})")
    values: dict[str, Any] = {}
    for key, (low, high) in [*_BOUNDS.items(), *((k, b) for k, b in _OPTIONAL.items() if k in data)]:
        value = data.get(key)
        integer = isinstance(low, int)
        if (not isinstance(value, int if integer else int | float) or isinstance(value, bool)
                or not math.isfinite(value) or not low <= value <= high):
            kind = "an integer" if integer else "a number"
            raise EngineModelError(f"{path}: '{key}' must be {kind} in [{low}, {high}], got {quote(value)}")
        values[key] = value
    for key in ("allocator", "label"):
        if not isinstance(data.get(key), str) or len(data[key]) > 1000:
            raise EngineModelError(f"{path}: '{key}' must be a string")
        values[key] = data[key]
    return EngineModel(**values)

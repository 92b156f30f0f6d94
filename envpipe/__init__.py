"""EnvPipe: energy-saving pipeline-parallel training on DeepSpeed.

    engine, optimizer, loader, scheduler = envpipe.initialize(args=args, model=pipeline_module, ...)

`envpipe.initialize` takes `deepspeed.initialize`'s arguments and returns its values (envpipe.runtime.entry).
Subpackages: ``plan`` (pure planning and simulation), ``profile`` (stage profiles, frequency
models), ``runtime`` (DeepSpeed integration), ``clock`` (clock sidecar and client),
``energy`` (energy meters, NVML), ``search`` (configuration search), ``layerprof`` (the per-layer
profiler the search reads), ``models`` (the GPT-2 and Llama pipelines of the examples and benchmarks),
``simgpu`` (the simulated GPU of CPU runs: its hidden truth, clocks and energy).
"""

import os
import sys
from typing import Any

__version__ = "0.1.0"

# DeepSpeed JIT-builds its C++ ops (on CPU its shared-memory all-reduce, at `deepspeed.init_distributed`) into
# torch's extensions folder, by default one per user (~/.cache/torch_extensions) that every checkout shares:
# another checkout's build, or the lock a killed build left, holds a job up for minutes without a word. A
# script that imports envpipe, and then calls `deepspeed.init_distributed` itself as DeepSpeed's tutorial does,
# builds into its own environment's folder instead (this project's venvs are per checkout, as the Makefile's
# folder is); a TORCH_EXTENSIONS_DIR already set is kept.
if sys.prefix != sys.base_prefix:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


def __getattr__(name: str) -> Any:
    if name == "initialize":  # imported on use: planning and the CLIs never load torch or DeepSpeed
        from envpipe.runtime.entry import initialize

        return initialize
    raise AttributeError(f"module 'envpipe' has no attribute {name!r}")

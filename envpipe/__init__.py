"""EnvPipe: energy-saving pipeline-parallel training on DeepSpeed.

    engine, optimizer, loader, scheduler = envpipe.initialize(args=args, model=pipeline_module, ...)

`envpipe.initialize` takes `deepspeed.initialize`'s arguments and returns its values (envpipe.runtime.entry).
Subpackages: ``plan`` (pure planning and simulation), ``profile`` (stage profiles, frequency
models), ``runtime`` (DeepSpeed integration), ``clock`` (clock sidecar and client),
``energy`` (energy meters), ``search`` (configuration search).
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "initialize":  # imported on use: planning and the CLIs never load torch or DeepSpeed
        from envpipe.runtime.entry import initialize

        return initialize
    raise AttributeError(f"module 'envpipe' has no attribute {name!r}")

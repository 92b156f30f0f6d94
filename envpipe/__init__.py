"""EnvPipe: energy-saving pipeline-parallel training on DeepSpeed.

Subpackages: ``plan`` (pure planning and simulation), ``profile`` (stage profiles, frequency
models), ``runtime`` (DeepSpeed integration), ``clock`` (clock sidecar and client),
``energy`` (energy meters).
"""

__version__ = "0.1.0"

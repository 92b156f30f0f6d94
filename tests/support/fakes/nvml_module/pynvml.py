"""`import pynvml` for a test process that must believe it has NVIDIA GPUs (put this folder first on
PYTHONPATH): benchmarks/clockd_study/fake_pynvml.py's FakeNvml at the module level, with an energy counter that grows
at a constant power over wall time and an SM clock held below the maximum, as a power-capped H200's is
under load (measured: 1455-1470 of 1980 MHz). Count, power and clock come from the environment:
FAKE_NVML_GPUS (2), FAKE_NVML_POWER_W (300), FAKE_NVML_SM_MHZ (1455)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def _with_the_real_pynvml() -> Any:
    """benchmarks/clockd_study/fake_pynvml.py, imported while `pynvml` is the real module (it takes its constants
    and error classes from there); afterwards `import pynvml` gives this module again."""
    me, here = sys.modules.pop(__name__), os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        from benchmarks.clockd_study import fake_pynvml

        return fake_pynvml
    finally:
        sys.path[:] = saved
        sys.modules[__name__] = me


_fake = _with_the_real_pynvml()
FakeGpu, FakeNvml = _fake.FakeGpu, _fake.FakeNvml
NVML_CLOCK_SM, NVMLError = _fake.NVML_CLOCK_SM, _fake.NVMLError

_POWER_W = float(os.environ.get("FAKE_NVML_POWER_W", "300"))
_T0 = time.monotonic()


class _TimedNvml(FakeNvml):
    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return h.energy_mj + int((time.monotonic() - _T0) * _POWER_W * 1000)


_nvml = _TimedNvml([FakeGpu(uuid=f"GPU-fake-{i}", sm_mhz=int(os.environ.get("FAKE_NVML_SM_MHZ", "1455")))
                    for i in range(int(os.environ.get("FAKE_NVML_GPUS", "2")))])


def __getattr__(name: str) -> Any:
    return getattr(_nvml, name)

"""A reference frequency curve: how much slower, and at what power, a unit runs per clock on a measured GPU.

Built from a real measured profile (averaged over its stages and over forward/backward). Used where only one
clock can be measured: `envpipe.profile.from_measured.profile_from_measured` carries a measured column to the
other clocks along it (off by the band of `envpipe.profile.band` across GPU kinds); and by the ``sim`` clock
backend and the layer profiler on CPU. Where several clocks are profiled, each unit gets its own fitted curve
instead (`envpipe.profile.clockfit`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envpipe.profile.csv_profile import Profile, embedded_profile_path, load_profile


@dataclass(frozen=True)
class FrequencyModel:
    clocks_mhz: tuple[int, ...]  # supported SM clocks, descending
    slowdown: tuple[float, ...]  # unit time at clock / unit time at the highest clock (>= 1)
    busy_power_w: tuple[float, ...]  # mean power while computing at that clock
    idle_power_w: float  # power while blocked (bubbles, waits)
    name: str = "sim"

    @classmethod
    def from_profile(cls, profile: Profile, idle_power_w: float, name: str = "sim") -> FrequencyModel:
        busy_time = profile.fwd_time + profile.bwd_time  # (S, K)
        busy_energy = profile.fwd_energy + profile.bwd_energy
        slowdown = (busy_time / busy_time[:, :1]).mean(axis=0)
        power = (busy_energy / busy_time).mean(axis=0)
        return cls(
            tuple(int(f) for f in profile.freqs),
            tuple(float(x) for x in slowdown),
            tuple(float(x) for x in power),
            float(idle_power_w),
            name,
        )

    @classmethod
    def default(cls) -> FrequencyModel:
        """The embedded default: the measured GPT-3/A100-SXM profile, 83.64 W blocking power."""
        return cls.from_profile(load_profile(embedded_profile_path()), 83.64, "sim-a100")

    @property
    def max_mhz(self) -> int:
        return self.clocks_mhz[0]

    def nearest_clock(self, mhz: float) -> int:
        arr = np.asarray(self.clocks_mhz)
        return int(arr[int(np.argmin(np.abs(arr - mhz)))])

    def _index(self, mhz: float) -> int:
        return self.clocks_mhz.index(self.nearest_clock(mhz))

    def time_scale(self, mhz: float) -> float:
        """Factor by which a unit measured at the highest clock lasts at ``mhz``."""
        return self.slowdown[self._index(mhz)]

    def busy_power(self, mhz: float) -> float:
        return self.busy_power_w[self._index(mhz)]

"""Energy meters: a cumulative energy counter sampled over time (NVML, or the simulated GPU's exact
counter), interpolated at pipeline-unit boundaries, and per-iteration accounting of unit energy."""

from envpipe.energy.meter import CounterTrace, EnergyMeter, PolledMeter, SimMeter, nvml_reader

__all__ = ["CounterTrace", "EnergyMeter", "PolledMeter", "SimMeter", "nvml_reader"]

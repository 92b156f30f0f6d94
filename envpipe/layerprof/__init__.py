"""The per-layer profiler behind `envpipe search` (torch): `profiler` measures every pipeline layer of a model, as
the training job builds it, into an `envpipe.search.layers.LayerProfile`.

Its own room, beside the runtime rather than in it: no runtime module imports it; it reads the GPU's NVML name
and the energy counter (`nvml_id`, `nvml_reader`) from `envpipe.energy`.
"""

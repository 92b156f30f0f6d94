"""What every prediction of the search starts from: the layer profile (the model, measured on one GPU), the
cluster (its GPUs, memory and links), the engine model (what DeepSpeed's pipeline engine adds) and whether the
units run as CUDA graphs (`envpipe search --cuda-graphs`, the runtime's `cuda_graphs`)."""

from __future__ import annotations

from dataclasses import dataclass

from envpipe.search.cluster import Cluster
from envpipe.search.engine_model import EngineModel, engine_model
from envpipe.search.layers import LayerProfile


@dataclass(frozen=True)
class SearchInputs:
    layers: LayerProfile
    cluster: Cluster
    engine: EngineModel
    graphed: bool = False  # units replayed as CUDA graphs (envpipe.runtime.engine.graphs)

    @classmethod
    def of(cls, layers: LayerProfile, cluster: Cluster, engine: EngineModel | None = None,
           graphed: bool = False) -> SearchInputs:
        """``engine`` by default: the fitted GPU engine, or none on the CPU's simulated GPU (engine_model)."""
        return cls(layers, cluster, engine or engine_model(layers), graphed)

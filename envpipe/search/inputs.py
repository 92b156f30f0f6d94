"""What every prediction of the search starts from: the layer profile (the model, measured on one GPU), the
cluster (its GPUs, memory and links) and the engine model (what DeepSpeed's pipeline engine adds)."""

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

    @classmethod
    def of(cls, layers: LayerProfile, cluster: Cluster, engine: EngineModel | None = None) -> SearchInputs:
        """``engine`` by default: the fitted GPU engine, or none on the CPU's simulated GPU (engine_model)."""
        return cls(layers, cluster, engine or engine_model(layers))

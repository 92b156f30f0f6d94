"""The shapes a job can take: P pipeline stages x D data-parallel replicas, micro-batch size and count."""

from __future__ import annotations

from dataclasses import dataclass

OBJECTIVES = ("throughput", "energy", "frontier")
MAX_PLAN_UNITS = 65536  # larger iterations keep their 1F1B all-max plan (about 10 s to plan one this size here)


class SearchError(ValueError):
    """The search cannot answer: inputs no configuration can satisfy; the message says which and why."""


@dataclass(frozen=True)
class Shape:
    stages: int  # P
    replicas: int  # D
    micro_batch: int  # samples per micro-batch on one GPU
    microbatches: int  # M, per replica and iteration

    @property
    def global_batch(self) -> int:
        return self.replicas * self.micro_batch * self.microbatches

    def label(self) -> str:
        return f"P={self.stages} D={self.replicas} b={self.micro_batch} M={self.microbatches}"


def shapes(gpus: int, num_layers: int, global_batch: int, micro_batch_sizes: tuple[int, ...]) -> list[Shape]:
    """Every shape that uses all ``gpus``: P divides the GPUs and is at most the layers, and the global batch
    is D x b x M for a profiled micro-batch size b."""
    if gpus < 1:
        raise SearchError(f"need at least one GPU, got {gpus}")
    if global_batch < 1:
        raise SearchError(f"the global batch must be at least 1, got {global_batch}")
    found = [Shape(P, gpus // P, b, global_batch // (gpus // P * b))
             for P in range(1, min(gpus, num_layers) + 1) if gpus % P == 0
             for b in micro_batch_sizes if global_batch % (gpus // P * b) == 0]
    if not found:
        stage_counts = [P for P in range(1, min(gpus, num_layers) + 1) if gpus % P == 0]
        raise SearchError(
            f"no pipeline shape uses {gpus} GPUs: the stages P must divide {gpus} and be at most the profile's "
            f"{num_layers} layers (P in {stage_counts}), and the global batch {global_batch} must be a multiple of "
            f"D x b (replicas D = {gpus} / P, micro-batch size b in the profile's {list(micro_batch_sizes)})")
    return found

"""The GPUs a search plans for, where DeepSpeed puts the ranks, and what communication costs there.

DeepSpeed's pipe x data grid numbers ranks stage-major: rank = stage x D + replica, and the launcher puts
ranks 0..G-1 on node 0, G..2G-1 on node 1, and so on. So a stage's D replicas (its gradient all-reduce)
share a node when D divides G, and the p2p link between stages crosses nodes when the ranks on its two
ends sit on different nodes.

Communication times are a simple alpha-beta model, with the bandwidths and the latency given (assumed,
or measured: benchmarks/search_links.py): point-to-point = latency + bytes / bandwidth; ring all-reduce
over D = 2 (D-1) (latency + bytes / (D bandwidth)), with the all-reduce's own (bus) bandwidth within a
node, where collectives and p2p often differ; all-gather = half of an all-reduce.

Memory: every process group of more than one rank has its NCCL communicator, which holds its channels' buffers
on the device, outside the caching allocator (torch creates each at the group's creation, from the world's, as
DeepSpeed binds the device: the NCCL logs of 2 x H200 runs, 2026-11-29, showed 6 such groups per rank of a
P = 2 pipeline and 3 of P = 1 x D = 2). ``communicators`` counts a rank's; what one holds on average is measured
once per machine (benchmarks/search_comms.py: a tiny model trained in each layout of the machine's GPUs, what its
ranks hold outside the allocator beyond one GPU's, over their groups).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    memory_bytes: int  # per GPU: the device's memory
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    latency_s: float
    allreduce_intra_bytes_per_s: float  # bus bandwidth of an all-reduce within a node
    margin_bytes: int = 0  # the device's peak must stay this far below its memory
    communicator_bytes: int = 0  # device memory of one process group's NCCL communicator, on average (measured)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"need at least one node and one GPU per node, got {self.nodes} x {self.gpus_per_node}")
        if self.memory_bytes <= 0 or not 0 <= self.margin_bytes < self.memory_bytes:
            raise ValueError("the memory per GPU must be positive and the margin below it")
        bandwidths = (self.intra_node_bytes_per_s, self.inter_node_bytes_per_s, self.allreduce_intra_bytes_per_s)
        if min(bandwidths) <= 0 or self.latency_s < 0:
            raise ValueError("bandwidths must be positive and the latency not negative")
        if self.communicator_bytes < 0:
            raise ValueError("a communicator's memory must not be negative")

    @property
    def usable_bytes(self) -> int:
        """What a configuration's device peak may reach."""
        return self.memory_bytes - self.margin_bytes

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def communicators_bytes(self, stages: int, replicas: int, stage: int) -> int:
        """Device memory the communicators of a rank of ``stage`` hold (``communicators``)."""
        return communicators(stages, replicas, stage) * self.communicator_bytes

    def _node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link_crosses_nodes(self, replicas: int, stage: int) -> bool:
        """Does the p2p link from ``stage`` to ``stage + 1`` cross nodes (for any replica)?"""
        D = replicas
        return any(self._node(stage * D + r) != self._node((stage + 1) * D + r) for r in range(D))

    def group_crosses_nodes(self, replicas: int, stage: int) -> bool:
        """Does the data-parallel group of ``stage`` span more than one node?"""
        D = replicas
        return self._node(stage * D) != self._node(stage * D + D - 1)

    def _bandwidth(self, crosses: bool) -> float:
        return self.inter_node_bytes_per_s if crosses else self.intra_node_bytes_per_s

    def p2p_s(self, nbytes: float, crosses: bool) -> float:
        return self.latency_s + nbytes / self._bandwidth(crosses)

    def allreduce_s(self, nbytes: float, replicas: int, crosses: bool) -> float:
        if replicas == 1:
            return 0.0
        D = replicas
        bandwidth = self.inter_node_bytes_per_s if crosses else self.allreduce_intra_bytes_per_s
        return 2 * (D - 1) * (self.latency_s + nbytes / (D * bandwidth))

    def allgather_s(self, nbytes: float, replicas: int, crosses: bool) -> float:
        return self.allreduce_s(nbytes, replicas, crosses) / 2


def communicators(stages: int, replicas: int, stage: int) -> int:
    """The process groups of more than one rank a rank of ``stage`` belongs to in a P x D job, each with its NCCL
    communicator: the world, DeepSpeed's PipelineModule's own group of every rank; with P > 1 the pipe group and
    DeepSpeed's model group (another of the same ranks); with D > 1 the data-parallel group; and the runtime's two
    groups per link to a neighbouring stage (envpipe.runtime.engine: activations, gradients). One GPU's groups
    (all of one rank) are in the engine model's fit."""
    if stages * replicas == 1:
        return 0
    neighbours = (stage > 0) + (stage < stages - 1)
    return 2 + 2 * (stages > 1) + (replicas > 1) + 2 * neighbours

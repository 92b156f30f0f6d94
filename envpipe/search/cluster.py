"""The GPUs a search plans for, where DeepSpeed puts the ranks, and what communication costs there.

DeepSpeed's pipe x data grid numbers ranks stage-major: rank = stage x D + replica, and the launcher puts
ranks 0..G-1 on node 0, G..2G-1 on node 1, and so on. So a stage's D replicas (its gradient all-reduce)
share a node when D divides G, and the p2p link between stages crosses nodes when the ranks on its two
ends sit on different nodes.

Communication times are a simple alpha-beta model, with the bandwidths and the latency given (assumed,
or measured: benchmarks/search_links.py): point-to-point = latency + bytes / bandwidth; ring all-reduce
over D = 2 (D-1) (latency + bytes / (D bandwidth)), with the all-reduce's own (bus) bandwidth within a
node, where collectives and p2p often differ; all-gather = half of an all-reduce.

Memory: every NCCL communicator of more than one rank holds its channels' buffers on the device, outside the
caching allocator (on 2 x H200, 2026-11-29, a pipeline stage of two held 2.2 to 2.7 GB more there than one GPU's
job: benchmarks/results/search_h200x2_call9_retrained.md). What one holds is measured once per machine
(benchmarks/search_links.py), for a collective's and for a point-to-point communicator; ``communicators`` counts
those a rank uses, from the groups DeepSpeed's pipeline engine and EnvPipe's runtime use.
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
    collective_communicator_bytes: int = 0  # device memory of one NCCL communicator's collectives (measured)
    p2p_communicator_bytes: int = 0  # ... of one used for sends and receives

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"need at least one node and one GPU per node, got {self.nodes} x {self.gpus_per_node}")
        if self.memory_bytes <= 0 or not 0 <= self.margin_bytes < self.memory_bytes:
            raise ValueError("the memory per GPU must be positive and the margin below it")
        bandwidths = (self.intra_node_bytes_per_s, self.inter_node_bytes_per_s, self.allreduce_intra_bytes_per_s)
        if min(bandwidths) <= 0 or self.latency_s < 0:
            raise ValueError("bandwidths must be positive and the latency not negative")
        if min(self.collective_communicator_bytes, self.p2p_communicator_bytes) < 0:
            raise ValueError("a communicator's memory must not be negative")

    @property
    def usable_bytes(self) -> int:
        """What a configuration's device peak may reach."""
        return self.memory_bytes - self.margin_bytes

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def communicator_bytes(self, stages: int, replicas: int, stage: int) -> int:
        """Device memory the communicators of a rank of ``stage`` hold (``communicators``)."""
        collective, p2p = communicators(stages, replicas, stage)
        return collective * self.collective_communicator_bytes + p2p * self.p2p_communicator_bytes

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


def communicators(stages: int, replicas: int, stage: int) -> tuple[int, int]:
    """The communicators of more than one rank a rank of ``stage`` uses in a P x D job, (collective,
    point-to-point): torch makes one per process group on its first use. The world's (DeepSpeed's barriers, the
    runtime's gathers of its measures); with P > 1 the pipe group's (the loss's broadcast) and DeepSpeed's model
    group's, another group of the same ranks (its first all-reduce counts the parameters, the optimizer's
    gradient norm); with D > 1 the data-parallel group's (the gradients' all-reduce, the weights' all-gather);
    and the runtime's two groups per link to a neighbouring stage (envpipe.runtime.engine: one for the
    activations, one for the gradients), each a point-to-point communicator."""
    if stages * replicas == 1:
        return 0, 0
    collective = 1 + 2 * (stages > 1) + (replicas > 1)
    neighbours = (stage > 0) + (stage < stages - 1)
    return collective, 2 * neighbours

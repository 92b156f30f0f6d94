"""What a training process holds on its GPU besides the caching allocator's allocated bytes, as the accuracy
benchmarks of `envpipe search` measure it (benchmarks/search_accuracy.py on one GPU, benchmarks/search_run.py on
several): what the process holds outside the allocator (the CUDA context, library handles, NCCL's communicators
and buffers; cudaMemGetInfo, the process alone on its GPU) and what CUDA graphs' private pools hold."""

from __future__ import annotations

import torch


def outside_allocator_bytes(device: torch.device) -> int:
    """The device's memory in use that the caching allocator has not reserved (the process alone on the GPU)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def graph_pool_bytes() -> int:
    """The bytes of every private memory pool (CUDA graphs' recordings): memory no tensor the allocator counts
    as allocated owns, held as long as the recordings are."""
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot() if tuple(seg["segment_pool_id"]) != (0, 0))

"""Measure the links `envpipe search` models: p2p latency and bandwidth, all-reduce bus bandwidth.

Run under torchrun with 2 processes (on GPUs: 2 GPUs of one node, NCCL; on CPU: gloo), the backend the
training job uses. Rank 0 writes ``--out`` (JSON) and prints the `envpipe search` options that use it:

    torchrun --standalone --nproc-per-node 2 benchmarks/search_links.py --out links.json
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/search_links.py --out links.json

p2p: ping-pong of a small and a large tensor (one way = half the round trip); latency and bandwidth from
the two sizes. All-reduce: bus bandwidth 2 (D-1)/D x bytes / time at a gradient-sized tensor. Medians of
``--reps``. Nothing but tensors moves; clocks are never touched. On CPU the job's p2p link is the simulated
GPU's (its activations travel in virtual time over envpipe.runtime.clocks.SimClock's link), so that link is
reported (simulated); the all-reduce is real work there too and is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.distributed as tdist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envpipe.runtime import distributed
from envpipe.simgpu import LINK

SMALL, LARGE = 4 << 10, 16 << 20  # bytes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_s(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after two warm-up runs (device synchronized around each)."""
    times = []
    for i in range(reps + 2):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def one_way_s(nbytes: int, device: torch.device, reps: int) -> float:
    x = torch.zeros(nbytes // 4, device=device)
    peer = 1 - tdist.get_rank()

    def round_trip() -> None:
        if peer == 1:
            tdist.send(x, 1)
            tdist.recv(x, 1)
        else:
            tdist.recv(x, 0)
            tdist.send(x, 0)

    return median_s(round_trip, device, reps) / 2


def allreduce_bus_bytes_per_s(nbytes: int, device: torch.device, reps: int) -> float:
    x = torch.zeros(nbytes // 4, device=device)
    D = tdist.get_world_size()
    return 2 * (D - 1) / D * nbytes / median_s(lambda: tdist.all_reduce(x), device, reps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    on_gpu = os.environ.get("DS_ACCELERATOR") != "cpu" and torch.cuda.is_available()
    distributed.init_distributed(on_gpu)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    if on_gpu:
        small, large = one_way_s(SMALL, device, args.reps), one_way_s(LARGE, device, args.reps)
        bandwidth = (LARGE - SMALL) / max(large - small, 1e-12)
        latency, p2p = max(0.0, small - SMALL / bandwidth), "measured"
    else:
        bandwidth, latency, p2p = LINK.bytes_per_s, LINK.latency_s, "simulated: the CPU's simulated GPU's link"
    allreduce = allreduce_bus_bytes_per_s(LARGE, device, args.reps)
    if tdist.get_rank() == 0:
        links = {
            "label": f"p2p {p2p}; all-reduce measured",
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
            "backend": tdist.get_backend(),
            "p2p_latency_us": latency * 1e6,
            "p2p_gbps": bandwidth / 1e9,  # gigaBYTES per second (the key predates `envpipe search`'s gigabit options)
            "allreduce_bus_gbps": allreduce / 1e9,
        }
        Path(args.out).write_text(json.dumps(links, indent=1) + "\n")
        print(json.dumps(links))
        print(f"envpipe search options (gigabits per second): --intra-node-gbps {8 * bandwidth / 1e9:.3g} "
              f"--allreduce-gbps {8 * allreduce / 1e9:.3g} --latency-us {latency * 1e6:.3g}")
    tdist.barrier()


if __name__ == "__main__":
    main()
    distributed.exit_process()

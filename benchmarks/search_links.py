"""Measure the links `envpipe search` models: p2p latency and bandwidth, all-reduce bus bandwidth.

Run under torchrun with 2 processes (on GPUs: 2 GPUs of one node, NCCL; on CPU: gloo), the backend the
training job uses. Rank 0 writes ``--out`` (JSON) and prints the `envpipe search` options that use it:

    torchrun --standalone --nproc-per-node 2 benchmarks/search_links.py --out links.json
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/search_links.py --out links.json

p2p: ping-pong of a small and a large tensor (one way = half the round trip); latency and bandwidth from
the two sizes. All-reduce: bus bandwidth 2 (D-1)/D x bytes / time between two gradient-sized tensors (256 MiB and
1 GiB: the time a gradient's bytes add, past the sizes where a collective has not reached its speed; on 2 x H200,
2026-11-29, 16 MiB ran at 149.5 GB/s, and the runtime's report put a training run's all-reduce of 1.26 GB of
gradients at 4.9 ms), the time of each size beside it. Medians of ``--reps``. What a communicator holds on the
device is benchmarks/search_comms.py's, which writes it into the same file. Nothing but tensors moves; clocks are
never touched. On CPU the job's p2p link is the simulated
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

MIB = 1 << 20
SMALL, LARGE = 4 << 10, 16 << 20  # bytes
ALLREDUCE_SIZES = (16 << 20, 256 << 20, 1 << 30)  # bytes; the bandwidth from the last two


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


def allreduce_s(nbytes: int, device: torch.device, reps: int) -> float:
    x = torch.zeros(nbytes // 4, device=device)
    return median_s(lambda: tdist.all_reduce(x), device, reps)


def bus_bytes(nbytes: int) -> float:
    """What a ring all-reduce of ``nbytes`` moves over each rank's link (bus bandwidth x time)."""
    D = tdist.get_world_size()
    return 2 * (D - 1) / D * nbytes


def search_options(links: dict) -> str:
    """The `envpipe search` options that use ``links`` (bandwidths in gigabits per second, memory in MiB; a
    communicator's where benchmarks/search_comms.py measured it)."""
    options = (f"--intra-node-gbps {8 * links['p2p_gbps']:.6g} --allreduce-gbps {8 * links['allreduce_bus_gbps']:.6g} "
               f"--latency-us {links['p2p_latency_us']:.6g}")
    if "communicators" in links:
        options += f" --communicator-mib {links['communicators']['per_group_bytes'] / MIB:.6g}"
    return options


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
    sizes = ALLREDUCE_SIZES if on_gpu else (LARGE // 4, LARGE)  # CPU: gloo's all-reduce of 1 GiB takes seconds
    times = [allreduce_s(n, device, args.reps) for n in sizes]
    allreduce = (bus_bytes(sizes[-1]) - bus_bytes(sizes[-2])) / max(times[-1] - times[-2], 1e-12)
    if tdist.get_rank() == 0:
        links = {
            "label": f"p2p {p2p}; all-reduce measured",
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
            "backend": tdist.get_backend(),
            "p2p_latency_us": latency * 1e6,
            "p2p_gbps": bandwidth / 1e9,  # gigaBYTES per second (the key predates `envpipe search`'s gigabit options)
            "allreduce_bus_gbps": allreduce / 1e9,
            "allreduce_s_by_bytes": {str(n): t for n, t in zip(sizes, times, strict=True)},
        }
        Path(args.out).write_text(json.dumps(links, indent=1) + "\n")
        print(json.dumps(links))
        print(search_options(links))
    tdist.barrier()


if __name__ == "__main__":
    main()
    distributed.exit_process()

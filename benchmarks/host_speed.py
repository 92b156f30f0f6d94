"""How steady the host's speed is on the machine the GPU benchmarks run on: a fixed host workload timed over and
over, its per-window medians, and the CPU time the hypervisor took (steal).

    python benchmarks/host_speed.py --out host_speed.json --seconds 10

Launch-bound training (small micro-batches, narrow layers) runs at the host's pace, so a host whose speed
changes over time changes the iteration time no profile taken at another time can predict. Two workloads,
each for ``--seconds`` seconds unpinned and again pinned to one CPU (os.sched_setaffinity):
- python: a pure-Python loop of fixed work (integer additions), no allocation, no GPU;
- launches (GPUs only): 64 launches of a tiny kernel (an in-place add on 16 numbers) per sample, the device
  synchronized every 16 samples, as launch-bound training issues kernels.
Per workload and pinning, each 100 ms window's median sample time (seconds) and the steal time over it
(/proc/stat, all CPUs, in the kernel's ticks). Read-only: no clock or power setting is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WINDOW_S = 0.1


def python_work() -> None:
    total = 0
    for i in range(2000):
        total += i


def steal_ticks() -> int | None:
    """Steal time of all CPUs since boot (/proc/stat's 8th field), None where there is no /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    return int(fields[8]) if len(fields) > 8 else None


def windows(work: Callable[[], None], seconds: float, every: Callable[[int], None] | None = None) -> list[float]:
    """The median time of one ``work`` in each window of WINDOW_S over ``seconds``; ``every(n)`` after sample n."""
    out, samples, n = [], [], 0
    end = time.perf_counter() + seconds
    window_end = time.perf_counter() + WINDOW_S
    while (now := time.perf_counter()) < end:
        work()
        samples.append(time.perf_counter() - now)
        n += 1
        if every is not None:
            every(n)
        if time.perf_counter() >= window_end:
            out.append(statistics.median(samples))
            samples, window_end = [], window_end + WINDOW_S
    return out


class HostWatch:
    """The python workload's window medians, one window every ``every_s``, in a thread of this process while the
    context is open: the host's speed beside a GPU job running in another process (on another CPU), at little
    cost to it (a window in every ``every_s``)."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.window_medians_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="host-watch", daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s - WINDOW_S):
            self.window_medians_s.extend(windows(python_work, WINDOW_S))

    def __enter__(self) -> HostWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def to_json(self) -> dict[str, Any]:
        return {"window_s": WINDOW_S, "every_s": self.every_s, "window_medians_s": self.window_medians_s,
                "label": "measured: the python workload's median sample per window, in the benchmark's parent "
                         "process while the child ran"}


def launches() -> tuple[Callable[[], None], Callable[[int], None]] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    x = torch.zeros(16, device="cuda")

    def work() -> None:
        for _ in range(64):
            x.add_(1.0)

    def drain(n: int) -> None:
        if n % 16 == 0:
            torch.cuda.synchronize()

    work()
    torch.cuda.synchronize()
    return work, drain


def measure(seconds: float) -> dict[str, Any]:
    gpu = launches()
    workloads: dict[str, tuple[Callable[[], None], Callable[[int], None] | None]] = {"python": (python_work, None)}
    if gpu is not None:
        workloads["launches"] = gpu
    cpus = sorted(os.sched_getaffinity(0))
    result: dict[str, Any] = {"window_s": WINDOW_S, "cpus": len(cpus), "runs": []}
    for pinned in (False, True):
        os.sched_setaffinity(0, {cpus[-1]} if pinned else set(cpus))
        for name, (work, every) in workloads.items():
            before = steal_ticks()
            medians = windows(work, seconds, every)
            after = steal_ticks()
            result["runs"].append({"workload": name, "pinned": pinned, "window_medians_s": medians,
                                   "steal_ticks": None if before is None or after is None else after - before})
    os.sched_setaffinity(0, set(cpus))
    result["clock_ticks_per_s"] = os.sysconf("SC_CLK_TCK")
    result["label"] = ("measured: fixed host workloads, the median sample of every window; steal from /proc/stat "
                       "(all CPUs)")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=10.0, help="per workload and pinning")
    args = p.parse_args()
    args.out.write_text(json.dumps(measure(args.seconds)) + "\n")


if __name__ == "__main__":
    main()

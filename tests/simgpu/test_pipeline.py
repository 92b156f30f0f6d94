"""Simulated GPUs as a pipeline: 1F1B over two stages with the virtual times travelling with the data, as the
runtime's engine carries them. Worked numbers without noise; the same job twice gives the same counters."""

from __future__ import annotations

import pytest

from envpipe.profile import Profile
from envpipe.simgpu import JobTruth, SimGpu

FLOPS = [{"F": 1.0e9, "B": 2.0e9}, {"F": 1.2e9, "B": 2.4e9}]  # 10/20 ms and 12/24 ms at the top clock
LINK_S = 10e-6  # an empty message: the link's latency


def one_f_one_b(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    warmup = min(microbatches, stages - stage)
    order = [("F", m) for m in range(warmup)]
    for m in range(microbatches - warmup):
        order += [("B", m), ("F", warmup + m)]
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]


def run(job: JobTruth, microbatches: int, seed: int = 0, noise: float = 0.01) -> list[SimGpu]:
    """One iteration: each stage runs its next unit once its input has been sent (the sender's end + link)."""
    gpus = [SimGpu(job, s, seed=seed, noise=noise) for s in range(job.stages)]
    orders = [one_f_one_b(job.stages, microbatches, s) for s in range(job.stages)]
    sent: dict[tuple[str, int, int], float] = {}
    done = [0] * job.stages
    while any(done[s] < len(orders[s]) for s in range(job.stages)):
        ran = False
        for s, gpu in enumerate(gpus):
            if done[s] == len(orders[s]):
                continue
            kind, m = orders[s][done[s]]
            need = ("F", s - 1, m) if kind == "F" else ("B", s + 1, m)
            if 0 <= need[1] < job.stages:
                if need not in sent:
                    continue
                gpu.data_ready(sent[need])
            gpu.unit_start()
            sent[(kind, s, m)] = gpu.unit_end(kind, FLOPS[s][kind]) + gpu.transfer_s(0)
            done[s] += 1
            ran = True
        assert ran, "deadlock"
    end = max(g.now() for g in gpus)
    for g in gpus:
        g.sync(end)  # the iteration ends on every GPU when the last one is done
    return gpus


def test_two_stage_1f1b_worked(bloom: Profile) -> None:
    """M = 2. Stage 0: F0 [0, 10], F1 [10, 20] ms; stage 1: F0 from 10 ms + link to 22 ms + link, B0 24 ms,
    F1 12 ms, B1 24 ms, ending at 82 ms + link; stage 0's B0 waits for stage 1's B0 (46 ms + 2 links), its B1
    for stage 1's B1: the iteration ends at 102 ms + 2 links. Energy: busy units at the table's top power
    (stage 0 runs BLOOM/A40's stage 0, stage 1 its stage 7), the rest blocked at 70.38 W."""
    gpus = run(JobTruth.embedded(2), 2, noise=0.0)
    end = 0.102 + 2 * LINK_S
    assert [g.now() for g in gpus] == pytest.approx([end, end])

    def watts(stage: int, kind: str) -> float:
        t, e = (bloom.fwd_time, bloom.fwd_energy) if kind == "F" else (bloom.bwd_time, bloom.bwd_energy)
        return float(e[stage, 0] / t[stage, 0])

    busy0 = 2 * 0.010 * watts(0, "F") + 2 * 0.020 * watts(0, "B")
    busy1 = 2 * 0.012 * watts(7, "F") + 2 * 0.024 * watts(7, "B")
    assert gpus[0].energy_j() == pytest.approx(busy0 + (end - 0.060) * 70.38)
    assert gpus[1].energy_j() == pytest.approx(busy1 + (end - 0.072) * 70.38)


def test_the_same_job_twice_gives_the_same_counters() -> None:
    job = JobTruth.embedded(2)
    first, second = run(job, 8, seed=3), run(job, 8, seed=3)
    for a, b in zip(first, second, strict=True):
        assert (a.trace._t, a.trace._j) == (b.trace._t, b.trace._j)
    other = run(job, 8, seed=4)
    assert [g.energy_j() for g in other] != [g.energy_j() for g in first]
    quiet = run(job, 8, noise=0.0)
    for noisy, exact in zip(first, quiet, strict=True):  # 1 % noise per unit: the iteration within a few %
        assert noisy.energy_j() == pytest.approx(exact.energy_j(), rel=0.03)

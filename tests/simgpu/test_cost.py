"""The simulated GPU's one cost rule (envpipe.simgpu.cost) and its FLOP counter (envpipe.simgpu.flops)."""

from __future__ import annotations

import pytest

from envpipe.simgpu import LINK, FlopCount, Link, step_s, unit_s


def test_units_last_their_flops_at_the_nominal_rate() -> None:
    assert unit_s(1e9) == pytest.approx(0.010)  # 1 GFLOP at 100 GFLOP/s
    assert unit_s(2.08e9) == pytest.approx(0.0208)  # the demo's last-stage backward
    assert unit_s(0.0) == 10e-6  # no FLOPs counted (an embedding lookup): still a launch
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="non-negative"):
            unit_s(bad)


def test_optimizer_step_is_its_bytes_at_the_nominal_bandwidth() -> None:
    assert step_s(1_000_000) == pytest.approx(28e6 / 1e10)  # 28 B per parameter at 10 GB/s: 2.8 ms
    assert step_s(1_000_000, bytes_per_parameter=16) == pytest.approx(1.6e-3)
    with pytest.raises(ValueError, match="non-negative"):
        step_s(-1)


def test_link_transfer_and_ring_allreduce() -> None:
    assert LINK.transfer_s(25_000_000) == pytest.approx(10e-6 + 1e-3)  # 25 MB at 25 GB/s plus latency
    # 4 ranks: 6 steps of 1 MB each (4 MB / 4) plus 6 latencies = 6 x 40 us + 60 us
    assert LINK.allreduce_s(4_000_000, 4) == pytest.approx(300e-6)
    assert LINK.allreduce_s(4_000_000, 1) == 0.0
    assert Link(latency_s=0.0, bytes_per_s=1e9).transfer_s(1000) == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="at least one rank"):
        LINK.allreduce_s(1, 0)
    with pytest.raises(ValueError, match="non-negative size"):
        LINK.transfer_s(-1)


def test_flop_count_around_a_matmul() -> None:
    import torch

    a, b = torch.ones(64, 32), torch.ones(32, 16)
    with FlopCount() as count:
        a @ b
    assert count.flops == 2 * 64 * 32 * 16
    split = FlopCount().start()  # the engine's way: start in one instruction, stop in the next
    a @ b
    a @ b
    assert split.stop() == 2 * 2 * 64 * 32 * 16
    with pytest.raises(RuntimeError, match="not started"):
        split.stop()
    running = FlopCount().start()
    with pytest.raises(RuntimeError, match="already running"):
        running.start()
    running.stop()

"""The per-layer profiler on CPU: the allocation probe, and a profile of layers whose costs are known."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from envpipe.layerprof import profiler
from envpipe.layerprof.profiler import (
    AllocationWindows,
    HostRound,
    Measurement,
    Target,
    _Accumulator,
    _extra_host_s,
    _LayerWork,
    _Unit,
    _unit_calls,
    host_and_repeat,
    profile_layers,
)
from envpipe.search.layers import ModelShape, load_layer_profile

MB = 1 << 20


def test_allocation_windows_on_cpu() -> None:
    with AllocationWindows(torch.device("cpu")) as probe:
        with probe.window("kept"):
            kept = torch.empty(MB, dtype=torch.uint8)
        with probe.window("transient"):
            tmp = torch.empty(8 * MB, dtype=torch.uint8)
            del tmp
            small = torch.empty(MB // 2, dtype=torch.uint8)
        with probe.window("free"):
            del kept
    assert probe.held("kept") == MB and probe.peak("kept") == MB
    assert probe.held("transient") == MB // 2 and probe.peak("transient") == 8 * MB
    assert probe.held("free") == 0 and probe.peak("free") == 0  # a free of an earlier block is no allocation
    del small


class Square(torch.nn.Module):
    """x -> W x, keeps its input for the backward."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_profile_of_known_layers(tmp_path: Path, dtype: str) -> None:
    width, n = 64, 3

    def batch(b: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, width, device=device), torch.randn(b, width, device=device)

    target = Target([lambda: Square(width)] * n, batch, lambda out, y: ((out.float() - y) ** 2).mean(),
                    ModelShape("gpt2", n - 2, width, 1, 1, width))
    seen: list[str] = []
    profile = profile_layers(target, Measurement([1, 4], dtype, reps=2, warmup=1), torch.device("cpu"),
                             progress=seen.append)
    size = 4 if dtype == "fp32" else 2
    assert len(seen) == n and profile.device == "cpu" and profile.dtype == dtype
    assert profile.power_label.startswith("simulated") and profile.measured_mhz is None
    for i, layer in enumerate(profile.layers):
        assert layer.parameters == width * width and layer.param_bytes == width * width * size
        # AdamW moments in fp32; bf16 adds the fp32 master weights (DeepSpeed's BF16_Optimizer)
        assert layer.optimizer_state_bytes == width * width * (8 if dtype == "fp32" else 12)
        for b, cost in layer.per_micro_batch.items():
            assert cost.forward_s > 0 and cost.backward_s > 0
            out = b * width * size
            assert cost.output_bytes == out  # the head's too: its logits, which the engine keeps
            assert cost.activation_bytes >= (out if i < n - 1 else 0)
            assert cost.forward_host_s == cost.backward_host_s == 0  # CPU: a simulated GPU, never launch-bound
            assert cost.forward_peak_bytes >= cost.activation_bytes
    assert profile.unit_calls.load_s == {1: 0.0, 4: 0.0}  # CPU: no host work counted
    path = tmp_path / "layers.json"
    profile.save(path)
    again = load_layer_profile(path)
    assert again.layers == profile.layers and again.unit_calls == profile.unit_calls


def test_host_and_repeat_from_rounds_of_1_and_4() -> None:
    """A round of 4 units issued in 8 ms (forwards) and 12 ms (backwards), spanning 10 and 16 ms to the device's
    end; a round of 1 issued in 2 and 3 ms, spanning 4 and 7 ms: host (8 - 2) / 3 = 2 and (12 - 3) / 3 = 3 ms
    per unit, repeat (10 - 4) / 3 = 2 and (16 - 7) / 3 = 3 ms. A round of 4 over 4 would have charged what a
    round pays once (its edges, a backward() call) to every unit: 2 and 3 ms host, 2.5 and 4 ms repeat."""
    one = HostRound(2e-3, 3e-3, 4e-3, 7e-3)
    four = HostRound(8e-3, 12e-3, 10e-3, 16e-3)
    assert host_and_repeat(one, four, 4) == pytest.approx((2e-3, 3e-3, 2e-3, 3e-3))


def test_a_block_is_chained_the_embedding_and_the_head_are_not() -> None:
    """A layer whose output can be its own input is timed as a chain of itself; a round of 3 applications runs
    one backward() and adds the layer's gradients once per application (a stage of 3 such layers adds 3 layers'
    gradients), and leaves no gradient on its input."""
    block = Square(4).to(torch.bfloat16)
    with torch.no_grad():
        block.lin.weight.copy_(torch.eye(4))  # exact small integers in bf16
    accumulator = _Accumulator(block)
    unit = _Unit(_LayerWork(block, None, torch.device("cpu"), accumulator), torch.ones(2, 4, dtype=torch.bfloat16), 2)
    assert unit.chainable
    accumulator.flat.zero_()
    assert all(t >= 0 for t in unit._chain_round(3)) and unit.x.grad is None
    grad = block.lin.weight.grad  # the chain's gradient of W (applied 3 times), added once per application
    assert grad is not None and torch.equal(accumulator.flat, 3 * grad.flatten())
    ids = torch.zeros(2, 3, dtype=torch.long)
    embedding = torch.nn.Embedding(8, 4)
    assert not _Unit(_LayerWork(embedding, None, torch.device("cpu"), None), ids, 2).chainable
    head = Square(4)
    assert not _Unit(_LayerWork(head, lambda out, b: out.sum(), torch.device("cpu"), None), torch.randn(2, 4),
                     2).chainable


def test_extra_host_time_of_a_call() -> None:
    """The host's extra time for the longer of two functions, by medians of alternate samples: a 3 ms against a
    1 ms sleep is 2 ms (the timer's and the scheduler's jitter allowed)."""
    extra = _extra_host_s(lambda: time.sleep(3e-3), lambda: time.sleep(1e-3), torch.device("cpu"))
    assert extra == pytest.approx(2e-3, abs=0.7e-3)
    assert _extra_host_s(lambda: None, lambda: time.sleep(1e-3), torch.device("cpu")) == 0.0  # never negative


def test_no_unit_calls_on_cpu() -> None:
    """The CPU's simulated GPU counts no host work: the unit calls are 0 at every size."""
    target = Target([lambda: Square(8)], lambda b, d: (torch.randn(b, 8), torch.randn(b, 8)),
                    lambda out, y: (out - y).pow(2).mean(), ModelShape("gpt2", 1, 8, 1, 1, 8))
    calls = _unit_calls(target, [1, 2], torch.device("cpu"), "bf16")
    assert (calls.backward_call_s, calls.grad_zero_call_s, calls.load_s) == (0.0, 0.0, {1: 0.0, 2: 0.0})


def test_the_accumulator_adds_as_bf16_optimizer_does() -> None:
    """After a backward each weight's gradient is added into its slice of the flat bf16 buffer; before the next
    the gradients are zeroed in one call, so the buffer accumulates micro-batch after micro-batch."""
    module = Square(4).to(torch.bfloat16)
    acc = _Accumulator(module)
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    for _ in range(2):
        acc.before_backward()
        module(x).sum().backward()
        acc.after_backward()
    # d(sum(W x))/dW = 2 (two rows of ones) per micro-batch, twice
    assert torch.equal(acc.flat, torch.full((16,), 4.0, dtype=torch.bfloat16))
    weight = module.lin.weight
    assert weight.grad is not None and torch.equal(weight.grad, torch.full((4, 4), 2.0, dtype=torch.bfloat16))


def test_busy_power_per_micro_batch_is_the_devices_while_it_computes(monkeypatch) -> None:
    """The power meter (GPUs; here with a fake NVML counter and a fake clock): each size's busy power is its
    windows' energy, less the idle power over the time their units' device times leave, over those device times,
    summed over layers; the one busy power is the same over every window; the power rounds are counted from a
    unit's repeat time (about 0.1 s, at least one)."""
    clock = iter([0.0, 1.0, 1.0, 2.0, 2.0, 2.5])  # three windows: 1 s, 1 s and 0.5 s
    counter = iter([0.0, 300.0, 300.0, 700.0, 700.0, 900.0])  # joules
    monkeypatch.setattr(profiler, "time", SimpleNamespace(perf_counter=lambda: next(clock)))  # the module's alone
    meter = profiler._PowerMeter(torch.device("cpu"), 0.0)
    closed: list[bool] = []
    meter._read, meter._close, meter._idle_w = (lambda: next(counter)), (lambda: closed.append(True)), 100.0
    ran: list[int] = []
    for b, computing in ((1, 0.5), (2, 1.0), (1, 0.5)):  # layer 1 at sizes 1 and 2, layer 2 at size 1
        meter.measure(b, lambda b=b: ran.append(b), computing)
    meter.close()
    meter.close()
    busy, by_size, idle, label = meter.result((1, 2))
    assert ran == [1, 2, 1] and closed == [True]
    # size 1: 500 J in 1.5 s, 1 s of it computing: (500 - 100 x 0.5) / 1; size 2: 400 J, all of 1 s computing
    assert by_size == {1: pytest.approx(450.0), 2: pytest.approx(400.0)}
    assert busy == pytest.approx((900 - 100 * 0.5) / 2.0) and idle == 100.0
    assert label.startswith("measured: NVML energy counter")
    block = Square(4)
    unit = _Unit(_LayerWork(block, None, torch.device("cpu"), None), torch.ones(2, 4), 2)
    rounds: list[int] = []
    monkeypatch.setattr(unit, "_chain_round", lambda units: rounds.append(units))
    run, units = unit.power_rounds(0.01)  # ceil(0.1 s / (4 units x 10 ms)) rounds of 4
    run()
    assert rounds == [4, 4, 4] and units == 12
    rounds.clear()
    run, units = unit.power_rounds(1.0)
    run()
    assert rounds == [4] and units == 4

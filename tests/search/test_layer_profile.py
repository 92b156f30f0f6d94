"""The per-layer profiler on CPU: the allocation probe, and a profile of layers whose costs are known."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envpipe.runtime.layer_profile import AllocationWindows, Target, profile_layers
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
    profile = profile_layers(target, [1, 4], torch.device("cpu"), dtype, reps=2, warmup=1, progress=seen.append)
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
    path = tmp_path / "layers.json"
    profile.save(path)
    assert load_layer_profile(path).layers == profile.layers

"""Does profiling a model's layers one at a time (envpipe.runtime.layer_profile) give the host times of the same
layers issued as one chain, as DeepSpeed's pipeline engine issues a stage? Paired, so that the host's own speed
changes (benchmarks/host_speed.py) cancel.

    python benchmarks/layer_chain_check.py --out chain.json --blocks 8

Per model (--models, the held-out shapes of benchmarks/results/search_accuracy/call3/shapes.json), ``blocks``
transformer blocks (envpipe.models.gpt) in bf16 on the GPU at micro-batch 1, and ``pairs`` times, one right
after the other:
- chain: the blocks' forward one after the other, then one backward() over all of them with DeepSpeed's
  BF16_Optimizer work around it (every gradient zeroed in one call before, each added into its flat bf16
  buffer after), as the engine's unit; the host's issuing of each, from an idle device;
- profiled: every block as the layer profiler times it (its rounds of 1 and 4 units), the sums over the
  blocks of its host times and of its repeat times.
Writes per pair the four forward and four backward numbers (seconds). Clocks are never changed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from envpipe.models.gpt import layer_specs
from envpipe.runtime.layer_profile import _QUEUE, _Accumulator, _sync, _Unit, host_and_repeat
from envpipe.search.layers import ModelShape

SHAPES = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "search_accuracy" / "call3" / "shapes.json"


def chain_times(blocks: list[torch.nn.Module], x: torch.Tensor, accumulators: list[_Accumulator],
                device: torch.device) -> tuple[float, float]:
    """The host's issuing of the chain's forward and of its backward (with the optimizer's work), idle device."""
    _sync(device)
    t0 = time.perf_counter()
    h = x
    for block in blocks:
        h = block(h)
    t1 = time.perf_counter()
    _sync(device)
    t2 = time.perf_counter()
    torch._foreach_zero_([p.grad for a in accumulators for p in a.params if p.grad is not None])
    h.backward(torch.ones_like(h))
    for a in accumulators:
        a.after_backward()
    t3 = time.perf_counter()
    _sync(device)
    return t1 - t0, t3 - t2


def check(shape: ModelShape, blocks: int, pairs: int, device: torch.device) -> list[dict[str, float]]:
    torch.manual_seed(0)
    with torch.device(device):
        modules = [spec.build().to(torch.bfloat16) for spec in layer_specs(shape)[1:1 + blocks]]
    x = torch.randn(1, shape.seq, shape.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    accumulators = [_Accumulator(m) for m in modules]
    inputs, h = [], x
    for m in modules:  # each block's real input, as the profiler takes it
        inputs.append(h.detach())
        h = m(h)
    units = [_Unit(m, i, 1, None, device, a) for m, i, a in zip(modules, inputs, accumulators, strict=True)]
    for _ in range(2):  # warm-up of both
        chain_times(modules, x, accumulators, device)
        for u in units:
            u.backward(u.forward()[1])
    out = []
    for _ in range(pairs):
        forward, backward = chain_times(modules, x, accumulators, device)
        sums = [0.0] * 4
        for u in units:
            one, queue = u._host_round(1), u._host_round(_QUEUE)
            sums = [s + v for s, v in zip(sums, host_and_repeat(one, queue, _QUEUE), strict=True)]
        out.append({"chain_forward_s": forward, "chain_backward_s": backward, "profiled_forward_host_s": sums[0],
                    "profiled_backward_host_s": sums[1], "profiled_forward_repeat_s": sums[2],
                    "profiled_backward_repeat_s": sums[3]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--pairs", type=int, default=20)
    args = p.parse_args()
    device = torch.device("cuda", 0)
    declared = json.loads(SHAPES.read_text())["heldout"]["models"]
    result: dict[str, Any] = {"blocks": args.blocks, "micro_batch": 1, "device": torch.cuda.get_device_name(device),
                              "label": "measured: host times (time.perf_counter), paired", "models": {}}
    for entry in declared:
        result["models"][entry["name"]] = check(ModelShape(**entry["model"]), args.blocks, args.pairs, device)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

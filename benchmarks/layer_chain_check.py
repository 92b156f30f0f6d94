"""Does profiling a model's layers one at a time (envpipe.layerprof.profiler) give the host times of the same
layers issued as one chain, as DeepSpeed's pipeline engine issues a stage? Paired, so that the host's own speed
changes (benchmarks/host_speed.py) cancel.

    python benchmarks/layer_chain_check.py --out chain.json --blocks 8

Per model (the held-out shapes of --shapes, default benchmarks/results/search_accuracy/call4/shapes.json), ``blocks``
transformer blocks (envpipe.models.gpt) in bf16 on the GPU at micro-batch 1, and ``pairs`` times, one right
after the other:
- chain: the blocks' forward one after the other, then one backward() over all of them with DeepSpeed's
  BF16_Optimizer work around it (every gradient zeroed in one call before, each added into its flat bf16
  buffer after), as the engine's unit; the host's issuing of each, from an idle device;
- profiled: every block as the layer profiler times it, the sums over the blocks of its host times and of its
  repeat times from its rounds of 1 and 4 units: as version 4 profiles take them (``chained_*``: the block
  applied 4 times and once in one forward pass and one backward()) and as version 3 did (``separate_*``:
  4 units and 1, each with its own backward(), less the unit calls the profile measured).
Writes per pair the chain's two numbers and each method's four (seconds). Clocks are never changed.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

import torch

from envpipe.layerprof.profiler import (
    _QUEUE,
    Target,
    _Accumulator,
    _LayerWork,
    _sync,
    _Unit,
    _unit_calls,
    host_and_repeat,
)
from envpipe.models.gpt import counting, layer_specs, lm_loss
from envpipe.search.layers import ModelShape

SHAPES = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "search_accuracy" / "call4" / "shapes.json"
KEYS = ("forward_host_s", "backward_host_s", "forward_repeat_s", "backward_repeat_s")


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


def _batch(shape: ModelShape, b: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return next(counting(shape, b, device))


def check(shape: ModelShape, blocks: int, pairs: int, calls_s: float, device: torch.device
          ) -> list[dict[str, float]]:
    torch.manual_seed(0)
    with torch.device(device):
        modules = [spec.build().to(torch.bfloat16) for spec in layer_specs(shape)[1:1 + blocks]]
    x = torch.randn(1, shape.seq, shape.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    accumulators = [_Accumulator(m) for m in modules]
    inputs, h = [], x
    for m in modules:  # each block's real input, as the profiler takes it
        inputs.append(h.detach())
        h = m(h)
    units = [_Unit(_LayerWork(m, None, device, a), i, 1) for m, i, a in zip(modules, inputs, accumulators, strict=True)]
    for _ in range(2):  # warm-up of both
        chain_times(modules, x, accumulators, device)
        for u in units:
            u.backward(u.forward()[1])
    out = []
    for _ in range(pairs):
        forward, backward = chain_times(modules, x, accumulators, device)
        pair = {"chain_forward_s": forward, "chain_backward_s": backward}
        for method in ("chained", "separate"):
            sums = [0.0] * 4
            for u in units:
                round_of = u._chain_round if method == "chained" else u._host_round
                sums = [s + v for s, v in zip(sums, host_and_repeat(round_of(1), round_of(_QUEUE), _QUEUE),
                                              strict=True)]
            if method == "separate":  # each backward() of its own carried the unit calls
                sums = [sums[0], sums[1] - blocks * calls_s, sums[2], sums[3] - blocks * calls_s]
            pair |= {f"{method}_{k}": v for k, v in zip(KEYS, sums, strict=True)}
        out.append(pair)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--shapes", type=Path, default=SHAPES)
    args = p.parse_args()
    device = torch.device("cuda", 0)
    declared = json.loads(args.shapes.read_text())["heldout"]["models"]
    result: dict[str, Any] = {"blocks": args.blocks, "micro_batch": 1, "device": torch.cuda.get_device_name(device),
                              "label": "measured: host times (time.perf_counter), paired", "models": {}}
    for entry in declared:
        shape = ModelShape(**entry["model"])
        target = Target([spec.build for spec in layer_specs(shape)], functools.partial(_batch, shape), lm_loss, shape)
        calls = _unit_calls(target, [1], device, "bf16")
        result["models"][entry["name"]] = {"unit_calls_s": calls.backward_s,
                                           "pairs": check(shape, args.blocks, args.pairs, calls.backward_s, device)}
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

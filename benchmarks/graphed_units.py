"""Does capturing a pipeline unit as a CUDA graph take the host's pace out of its time? (issue #38)

A launch-bound unit's time is the host's issuing of its kernels, and on the lent hosts that varies 1.4-2.2x
within a minute (search_accuracy_call6.md). A unit replayed from a CUDA graph is one launch. This measures,
per held-out model of --shapes and micro-batch size, ``blocks`` transformer blocks (envpipe.models.gpt, bf16,
on the GPU) run as one unit, forward then backward(), in two ways, one step of each after the other, ``rounds``
rounds of ``steps`` steps a second apart:
- eager: as DeepSpeed's pipeline engine runs a stage's unit (every kernel issued by the host);
- graphed: the same blocks through torch.cuda.make_graphed_callables (forward and backward each one graph).
Per step: the host's issuing (time.perf_counter to the calls' return) and the whole step (to the device's
end, from an idle device). Clocks are never changed.

    python benchmarks/graphed_units.py run --out graphed.json [--blocks 8] [--rounds 12] [--steps 8]
    python benchmarks/graphed_units.py render graphed.json     # the results file, from the raw file
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "benchmarks" / "results" / "search_accuracy" / "call6" / "shapes.json"
MICRO_BATCHES = (1, 2, 4, 8)


class CaptureFailed(RuntimeError):
    """The blocks could not be captured as a CUDA graph."""


def _step(unit: Any, x: Any, grad: Any, sync: Any) -> tuple[float, float]:
    """One forward and backward() of ``unit`` from an idle device: (host issuing, whole step) in seconds."""
    sync()
    t0 = time.perf_counter()
    unit(x).backward(grad)
    t1 = time.perf_counter()
    sync()
    return t1 - t0, time.perf_counter() - t0


def measure(shape: Any, blocks: int, b: int, rounds: int, steps: int, device: Any) -> list[dict[str, list[float]]]:
    import torch

    from envpipe.models.gpt import layer_specs

    torch.manual_seed(0)
    with torch.device(device):
        eager = torch.nn.Sequential(*(spec.build() for spec in layer_specs(shape)[1:1 + blocks])).to(torch.bfloat16)
        graphed_blocks = torch.nn.Sequential(*(spec.build() for spec in layer_specs(shape)[1:1 + blocks]))
    graphed_blocks = graphed_blocks.to(torch.bfloat16)
    x = torch.randn(b, shape.seq, shape.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.ones_like(x)
    try:
        graphed = torch.cuda.make_graphed_callables(graphed_blocks, (x,))
    except RuntimeError as exc:  # a block that cannot be captured: say so in the raw file
        raise CaptureFailed(str(exc).splitlines()[0]) from None

    def sync() -> None:
        torch.cuda.synchronize(device)

    for _ in range(3):  # warm-up of both
        _step(eager, x, grad, sync)
        _step(graphed, x, grad, sync)
    out = []
    for r in range(rounds):
        if r:
            time.sleep(1.0)  # rounds a second apart: the host's speed drifts over seconds
        row: dict[str, list[float]] = {k: [] for k in ("eager_host_s", "eager_s", "graphed_host_s", "graphed_s")}
        for _ in range(steps):
            for name, unit in (("eager", eager), ("graphed", graphed)):
                host, whole = _step(unit, x, grad, sync)
                row[f"{name}_host_s"].append(host)
                row[f"{name}_s"].append(whole)
        out.append(row)
    return out


def run(args: argparse.Namespace) -> None:
    import torch

    from envpipe.search.layers import ModelShape

    device = torch.device("cuda", 0)
    declared = json.loads(args.shapes.read_text())["heldout"]["models"]
    result: dict[str, Any] = {
        "label": "measured: time.perf_counter around each step, torch.cuda.synchronize before and after",
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__, "blocks": args.blocks,
        "rounds": args.rounds, "steps": args.steps, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "models": {}}
    for entry in declared:
        shape = ModelShape(**entry["model"])
        per_b = result["models"].setdefault(entry["name"], {})
        for b in args.microbatches:
            try:
                per_b[str(b)] = measure(shape, args.blocks, b, args.rounds, args.steps, device)
            except torch.cuda.OutOfMemoryError:
                per_b[str(b)] = "out of memory"
            except CaptureFailed as exc:
                per_b[str(b)] = f"graph capture failed: {exc}"
            torch.cuda.empty_cache()
            args.out.write_text(json.dumps(result, indent=1) + "\n")  # what was measured survives a stop
            print(entry["name"], b, "done", flush=True)


def _spread(values: list[float]) -> float:
    """Max over min of the rounds' medians, less one: how far the host's pace moved the step between rounds."""
    return max(values) / min(values) - 1


def render(paths: list[Path]) -> str:
    data = json.loads(paths[0].read_text())
    raw = paths[0].relative_to(ROOT) if paths[0].is_relative_to(ROOT) else paths[0]
    lines = ["# Units captured as CUDA graphs: does the host's pace leave the unit's time? (issue #38)", "",
             f"Measured {data['started']} on one {data['device']} (torch {data['torch']}); "
             f"rendered by `python benchmarks/graphed_units.py render {raw}`.", "",
             f"{data['blocks']} transformer blocks of each held-out model of search_accuracy/call6 (bf16), forward "
             "and backward() as one unit: eager (every kernel issued by the host, as DeepSpeed's engine runs a "
             "unit) and graphed (torch.cuda.make_graphed_callables), one step of each after the other, "
             f"{data['rounds']} rounds of {data['steps']} steps a second apart. A round's time is its median step; "
             "the table gives the median over rounds and the spread between rounds (slowest round over fastest, "
             "less one). Clocks were not changed.", "",
             "| model | b | eager step (ms) | eager spread | eager host issuing (ms) | graphed step (ms) | "
             "graphed spread | eager / graphed |", "|---|---|---|---|---|---|---|---|"]
    launch_bound = []  # (eager spread, graphed spread, speed-up) where the host's issuing is most of the step
    for name, per_b in data["models"].items():
        for b, rounds in per_b.items():
            if isinstance(rounds, str):
                lines.append(f"| {name} | {b} | {rounds} |  |  |  |  |  |")
                continue
            med = {k: [statistics.median(r[k]) for r in rounds] for k in rounds[0]}
            eager, graphed = statistics.median(med["eager_s"]), statistics.median(med["graphed_s"])
            host = statistics.median(med["eager_host_s"])
            lines.append(f"| {name} | {b} | {eager * 1e3:.2f} | {_spread(med['eager_s']):+.1%} | "
                         f"{host * 1e3:.2f} | {graphed * 1e3:.2f} | {_spread(med['graphed_s']):+.1%} | "
                         f"{eager / graphed:.2f} |")
            if host >= 0.9 * eager:
                launch_bound.append((_spread(med["eager_s"]), _spread(med["graphed_s"]), eager / graphed))
    if launch_bound:
        eager_spreads, graphed_spreads, speedups = zip(*launch_bound, strict=True)
        lines += ["", f"Where the host's issuing is 90 % or more of the eager step ({len(launch_bound)} rows): the "
                  f"eager step moved {min(eager_spreads):.0%}-{max(eager_spreads):.0%} between rounds, the graphed "
                  f"one at most {max(graphed_spreads):.1%}, and the graphed step was {min(speedups):.2f}-"
                  f"{max(speedups):.2f}x faster."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure on GPU 0 (writes the raw file)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--shapes", type=Path, default=SHAPES)
    r.add_argument("--blocks", type=int, default=8)
    r.add_argument("--rounds", type=int, default=12)
    r.add_argument("--steps", type=int, default=8)
    r.add_argument("--microbatches", type=int, nargs="+", default=list(MICRO_BATCHES))
    d = sub.add_parser("render", help="print the results file rendered from a raw file")
    d.add_argument("raw", type=Path)
    args = ap.parse_args()
    if args.command == "run":
        run(args)
    else:
        sys.stdout.write(render([args.raw.resolve()]))


if __name__ == "__main__":
    main()

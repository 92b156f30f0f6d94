"""Where the drop-in engine's time goes: its parts switched on one at a time, iteration by iteration, in one job.

    torchrun --standalone --nproc-per-node 2 benchmarks/dropin_ablation.py --out OUT --model llama-16x2048
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/dropin_ablation.py --out OUT --cpu
    python benchmarks/runtime_results.py ablation OUT [OUT ...]          # the table

One EnvPipeEngine (envpipe.runtime.engine.engine.build: DeepSpeed's PipelineEngine with EnvPipe's instructions, no
phases) trains the model. Each cycle runs every variant once, in an order shuffled per cycle (seeded), so the
host's drift and any periodic effect fall on every variant alike; a variant's cost is its median iteration over
DeepSpeed's own path's. Variants, each one part on top of DeepSpeed's steps:

- `deepspeed`: DeepSpeed's own `TrainSchedule` through PipelineEngine's own `_exec_schedule` (the stock path);
- `steady`: the drop-in engine's steady iteration held to 1F1B (`Stock1F1BSchedule`, untimed; its
  `_exec_schedule` with the per-iteration bookkeeping);
- `unit-events`: `steady` with every unit timed (a CUDA event pair per unit, one synchronize), as every tenth
  steady iteration and every calibration iteration are;
- `posted-p2p`: 1F1B through `UnitOrderSchedule` (posted sends, per-direction process groups): the p2p path of
  EnvPipe's orders;
- `meter`: `steady` with the energy counter polled in a background thread (NVML on GPUs; stock runs have one too);
- `collective`: `steady` and one small all-gather (the calibration's per-iteration settle check; the report's
  gathers are every `summary_interval` iterations).

An iteration's time is the slowest rank's: a host timer around `train_batch` and a device synchronize. Clocks are
never changed. Writes OUT/ablation.json (every iteration of every variant) and OUT/machine.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


VARIANTS = ("deepspeed", "steady", "unit-events", "posted-p2p", "meter", "collective")
MODELS = {  # the shapes of benchmarks/runtime_bench.py (sequence, micro-batch): the runs this explains
    "gpt2-16x2048": ("gpt2", 16, 2048, 16, 1024, 4),
    "llama-16x2048": ("llama", 16, 2048, 16, 2048, 2),
    "tiny": ("gpt2", 4, 32, 2, 16, 2),
}
VOCAB, TINY_VOCAB = 50304, 128


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="a folder for ablation.json and machine.txt")
    p.add_argument("--model", default="llama-16x2048", choices=[m for m in MODELS if m != "tiny"])
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--cycles", type=int, default=12, help="iterations per variant")
    p.add_argument("--warmup", type=int, default=3, help="iterations before the cycles (not measured)")
    p.add_argument("--cpu", action="store_true", help="a tiny model on CPU processes (gloo): checks the script")
    args = p.parse_args(argv)
    if min(args.microbatches, args.cycles) < 1 or args.warmup < 0:
        p.error("--microbatches and --cycles must be >= 1, --warmup >= 0")
    return args


@contextlib.contextmanager
def patched(obj: Any, **attrs: Any) -> Iterator[None]:
    """Instance attributes shadowing ``obj``'s methods for one iteration."""
    for name, value in attrs.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name in attrs:
            delattr(obj, name)


def variants(engine: Any, data: Any, on_gpu: bool) -> dict[str, Callable[[], None]]:
    """Each variant as one training iteration of ``engine`` (every rank runs the same variant in turn); `meter` is
    `steady` run while `metering` polls the energy counter."""
    from deepspeed.runtime.pipe import schedule as ds
    from deepspeed.runtime.pipe.engine import PipelineEngine

    from envpipe.plan.schedules import one_f_one_b
    from envpipe.runtime.engine.schedule import UnitOrderSchedule
    from envpipe.runtime.measure import collective

    P, M, stage = engine.num_stages, engine.micro_batches, engine.stage_id
    order = one_f_one_b(P, M)

    def deepspeed_path() -> None:
        stock = ds.TrainSchedule(micro_batches=M, stages=P, stage_id=stage)
        with patched(engine, _train_schedule=lambda: stock,
                     _exec_schedule=lambda sched: PipelineEngine._exec_schedule(engine, sched)):
            PipelineEngine.train_batch(engine, data)

    def steady(timed: bool = False) -> None:
        engine.set_unit_orders(order, timing=timed)
        engine.train_batch(data)

    def posted() -> None:
        engine.set_unit_orders(order)
        with patched(engine, _train_schedule=lambda: UnitOrderSchedule(order[stage], M, P, stage)):
            engine.train_batch(data)


    def gathered() -> None:
        steady()
        collective.gather(1.0)

    return {"deepspeed": deepspeed_path, "steady": steady, "unit-events": lambda: steady(timed=True),
            "posted-p2p": posted, "meter": steady, "collective": gathered}


@contextlib.contextmanager
def metering(cuda_index: int | None) -> Iterator[None]:
    """The NVML energy counter of this CUDA device polled in a background thread, as every drop-in and stock run
    has one (None: no GPU, nothing to poll)."""
    from envpipe.runtime.clocks import NvmlEnergyClock, make_meter

    meter = make_meter(NvmlEnergyClock(cuda_index)) if cuda_index is not None else None
    try:
        yield
    finally:
        if meter is not None:
            meter.close()


def run(args: argparse.Namespace) -> None:
    import deepspeed
    import torch

    from envpipe.models.gpt import counting, pipeline
    from envpipe.runtime import distributed
    from envpipe.runtime.engine.engine import build
    from envpipe.runtime.measure import collective
    from envpipe.search.layers import ModelShape

    on_gpu = not args.cpu and torch.cuda.is_available()
    distributed.init_distributed(on_gpu)
    family, layers, hidden, heads, seq, micro = MODELS["tiny" if args.cpu else args.model]
    shape = ModelShape(family, layers, hidden, heads, seq, TINY_VOCAB if args.cpu else VOCAB)
    torch.manual_seed(1234)
    model = pipeline(shape, torch.distributed.get_world_size(), None)
    config: dict[str, Any] = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": args.microbatches,
                              "steps_per_print": 10**9}
    if on_gpu:
        config["bf16"] = {"enabled": True}
    engine = build(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), config=config)
    data = counting(shape, micro, engine.device, seed=0)
    parts = variants(engine, data, on_gpu)

    def timed(name: str) -> float:
        """One iteration of a variant; the meter's start and stop (NVML init, the thread) outside the timer."""
        with metering(engine.device.index or 0 if on_gpu else None) if name == "meter" else contextlib.nullcontext():
            t0 = time.perf_counter()
            parts[name]()
            if on_gpu:
                torch.cuda.synchronize()
            return time.perf_counter() - t0

    for name in [v for v in VARIANTS for _ in range(args.warmup)]:  # every path's first iterations
        timed(name)
    rng, mine = random.Random(0), []  # the same order on every rank: the variants' collectives meet
    for cycle in range(args.cycles):
        names = list(VARIANTS)
        rng.shuffle(names)
        mine += [(cycle, name, timed(name)) for name in names]
    everyone = collective.gather(mine)
    if collective.rank() == 0:
        from benchmarks.runtime_bench import machine

        rows = [{"cycle": c, "variant": v, "time_s": max(r[i][2] for r in everyone)} for i, (c, v, _) in
                enumerate(mine)]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "machine.txt").write_text(machine(args))
        (args.out / "ablation.json").write_text(json.dumps(
            {"command": " ".join(["python", "benchmarks/dropin_ablation.py", *sys.argv[1:]]),
             "model": "tiny (CPU)" if args.cpu else args.model,
             "microbatches": args.microbatches, "stages": engine.num_stages, "cycles": args.cycles,
             "deepspeed": deepspeed.__version__, "torch": torch.__version__, "on_gpu": on_gpu,
             "meter_timed": "polling only",
             "iterations": rows}, indent=1) + "\n")
    distributed.exit_process()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

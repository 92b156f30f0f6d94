"""Stock DeepSpeed 1F1B vs the EnvPipe runtime on the same model, in one process per stage; every result is
the runtime's own report (envpipe.runtime.summary.RunSummary).

Run under torchrun (one process per pipeline stage). Clocks are never changed: with no envpipe-clockd the
runtime's clock is 'auto', which on a GPU runs at default clocks and reads the NVML energy counter
(measured); on CPU the sim clock (simulated).

    torchrun --standalone --nproc-per-node 2 benchmarks/runtime_bench.py --out OUT --microbatches 8,16
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/runtime_bench.py --cpu --out OUT

For each M both engines are built once (same seed, same weights), then ``--rounds`` times, in reverse order
every other round so that drift favours neither: stock 1F1B for ``--steps`` iterations, and the runtime in
1F1B order with every clock at max (calibration, then ``--steps`` steady iterations). Then the runtime in
EnvPipe's order (its prediction), and the runtime's default policy (optimal): the plan it deploys, or on a
GPU without the clock daemon the plan it would deploy, with its simulated saving. Rank 0 writes
OUT/bench.json after every M (a run cut short keeps what it finished); benchmarks/runtime_results.py
renders it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import train_gpt  # noqa: E402  (examples/train_gpt.py: the model, the stock loop)

from envpipe.energy.meter import METER_PERIOD_S  # noqa: E402
from envpipe.runtime import config as envpipe_config  # noqa: E402
from envpipe.runtime import distributed  # noqa: E402
from envpipe.runtime.clocks import Device, make_clock  # noqa: E402
from envpipe.runtime.runner import Runner  # noqa: E402
from envpipe.runtime.summary import RunSummary  # noqa: E402

TINY = ["--tiny"]
GPT2_H200 = ["--model", "gpt2", "--layers", "16", "--hidden", "2048", "--heads", "16", "--seq", "1024",
             "--micro-batch", "4"]


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--microbatches", default="8", help="comma-separated M values")
    p.add_argument("--rounds", type=int, default=4, help="interleaved stock/runtime pairs per M")
    p.add_argument("--steps", type=int, default=15, help="measured iterations per run")
    p.add_argument("--calibration-steps", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="tiny model on CPU (gloo): checks the script's logic")
    args, model_args = p.parse_known_args(argv)
    args.ms = [int(m) for m in args.microbatches.split(",")]
    if any(m < 1 for m in args.ms) or args.rounds < 1 or args.steps < 1:
        p.error("M values, --rounds and --steps must be >= 1")
    return args, model_args


def runtime_run(engine: Any, data: Any, block: dict[str, Any], report_dir: Path, args: argparse.Namespace
                ) -> RunSummary | None:
    """The runtime with this `envpipe` block on ``engine``: its summary on rank 0, None elsewhere."""
    cfg = envpipe_config.parse({**block, "report_dir": str(report_dir)}, environ={})
    local = int(os.environ.get("LOCAL_RANK", "0"))
    clock = make_clock(cfg, Device(engine.device.type == "cuda", local, engine.grid.get_data_parallel_id()))
    try:
        return Runner(engine, cfg, clock, engine.train_batch_size()).train(data, args.steps, args.calibration_steps)
    finally:
        if clock is not None:
            clock.close()


def stock_run(engine: Any, data: Any, report_dir: Path, margs: argparse.Namespace) -> RunSummary | None:
    margs.report_dir = str(report_dir)
    cfg = envpipe_config.parse({"type": "baseline", "report_dir": str(report_dir)}, environ={})
    return train_gpt.run_stock(engine, data, margs, cfg, engine.train_batch_size())


def ratios(per_round: list[float]) -> dict[str, Any]:
    return {"per_round": per_round, "median": statistics.median(per_round), "min": min(per_round),
            "max": max(per_round)}


def bench_m(args: argparse.Namespace, model_args: list[str], M: int, out: Path) -> dict[str, Any]:
    margs = train_gpt.parse_args([*model_args, "--microbatches", str(M), "--steps", str(args.steps),
                                  "--calibration-steps", str(args.calibration_steps)])
    stock = train_gpt.build_engine(margs, {}, "stock")
    rt = train_gpt.build_engine(margs, {}, "envpipe")
    data_s, data_r = train_gpt.tokens(margs, stock.device), train_gpt.tokens(margs, rt.device)
    all_max_1f1b = {"type": "baseline", "scheduling": "1f1b", "clock": "auto", "compare_iterations": 0}
    rounds = []
    for r in range(args.rounds):
        got: dict[str, RunSummary | None] = {}
        for name in ("stock", "runtime_1f1b") if r % 2 == 0 else ("runtime_1f1b", "stock"):
            report = out / f"M{M}" / f"{name}_r{r}"
            got[name] = (stock_run(stock, data_s, report, margs) if name == "stock"
                         else runtime_run(rt, data_r, all_max_1f1b, report, args))
        rounds.append(got)
    envpipe_order = runtime_run(rt, data_r, {**all_max_1f1b, "scheduling": "envpipe"}, out / f"M{M}" / "envpipe",
                                args)
    optimal = runtime_run(rt, data_r, {"clock": "auto"}, out / f"M{M}" / "optimal", args)
    result: dict[str, Any] = {"M": M}
    if tdist.get_rank() == 0:
        per = [x["stock"].steady.time_s.median / x["runtime_1f1b"].steady.time_s.median  # type: ignore[union-attr]
               for x in rounds]
        result.update(
            throughput_ratio=ratios(per),
            rounds=[{k: v.to_json() for k, v in x.items() if v is not None} for x in rounds],
            runtime_envpipe=envpipe_order.to_json() if envpipe_order else None,
            runtime_optimal=optimal.to_json() if optimal else None,
        )
    del stock, rt
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    args, model_args = parse(argv)
    on_gpu = not args.cpu and train_gpt.uses_gpu()
    distributed.init_distributed(on_gpu)
    model_args = [*(TINY if args.cpu else GPT2_H200), *model_args]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench: dict[str, Any] = {
        "stages": tdist.get_world_size(),
        "model_args": model_args,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "steps": args.steps,
        "rounds": args.rounds,
        "meter_period_s": METER_PERIOD_S,
        "runs": [],
    }
    for M in args.ms:
        t0 = time.perf_counter()
        res = bench_m(args, model_args, M, out)
        res["wall_s"] = time.perf_counter() - t0
        bench["runs"].append(res)
        if tdist.get_rank() == 0:
            (out / "bench.json").write_text(json.dumps(bench, indent=1) + "\n")
            print(f"M={M} done in {res['wall_s']:.0f}s: throughput ratio {res['throughput_ratio']['median']:.4f}",
                  flush=True)
    tdist.barrier()


if __name__ == "__main__":
    main()
    distributed.exit_process()

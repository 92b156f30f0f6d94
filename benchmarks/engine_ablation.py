"""Where the runtime's time goes against stock DeepSpeed 1F1B: interleaved rounds of variants, one process
per stage, same model and weights. Clocks are never changed (no clock daemon; NVML is only read).

    torchrun --standalone --nproc-per-node 2 benchmarks/engine_ablation.py --out OUT [--microbatches 8,16]
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/engine_ablation.py --cpu --out OUT

Variants, each ``--steps`` iterations per round, in a rotated order every round (drift favours none):
- stock: DeepSpeed's PipelineEngine and TrainSchedule;
- engine: EnvPipeEngine in 1F1B order, no unit timing, no clock, no runner;
- engine+meter: the engine while a background thread polls the NVML energy counter (the runtime's meter);
- runtime: the runtime's own steady iteration (Runner.run: its JSON line, its energy bookkeeping, the meter).
With --torch-profile K, every rank also records K iterations of stock and of the runtime with torch.profiler
and writes the top operators by self CPU and by self CUDA time (OUT/profile_*.txt). Rank 0 writes
OUT/ablation.json and OUT/ablation.md.
"""

from __future__ import annotations

import argparse
import json
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

import train_gpt  # noqa: E402  (examples/train_gpt.py: the model)

from benchmarks.runtime_bench import GPT2_H200, TINY  # noqa: E402
from envpipe.energy.meter import PolledMeter, nvml_reader  # noqa: E402
from envpipe.runtime import config as envpipe_config  # noqa: E402
from envpipe.runtime import distributed  # noqa: E402
from envpipe.runtime.runner import Runner  # noqa: E402

VARIANTS = ("stock", "engine", "engine+meter", "runtime")


def timed(engine: Any, data: Any, steps: int, on_gpu: bool) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.train_batch(data)
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def run_variant(name: str, stock: Any, rt: Any, runner: Runner, data: Any, steps: int, on_gpu: bool) -> list[float]:
    if name == "stock":
        return timed(stock, data["stock"], steps, on_gpu)
    if name == "runtime":
        times = []
        for _ in range(steps):
            t = runner.run(data["rt"], runner.baseline, "steady", timed=False)
            times.append(t.step_end - t.step_start)
        return times
    rt.set_unit_orders(runner.baseline.orders())  # 1F1B, no clocks, no timing
    meter = None
    if name == "engine+meter" and on_gpu:
        read, close = nvml_reader(rt.device.index or 0)
        meter = PolledMeter(read, on_close=close)
    try:
        return timed(rt, data["rt"], steps, on_gpu)
    finally:
        if meter is not None:
            meter.close()


def profile(name: str, fn: Any, out: Path) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        fn()
    for key in ("self_cpu_time_total", "self_cuda_time_total")[: 2 if torch.cuda.is_available() else 1]:
        (out / f"profile_{name}_{key}.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=25) + "\n")


def bench_m(args: argparse.Namespace, model_args: list[str], M: int, out: Path, on_gpu: bool) -> dict[str, Any]:
    margs = train_gpt.parse_args([*model_args, "--microbatches", str(M)])
    stock = train_gpt.build_engine(margs, {}, "stock")
    rt = train_gpt.build_engine(margs, {}, "envpipe")
    cfg = envpipe_config.parse({"type": "baseline", "scheduling": "1f1b", "clock": "none",
                                "report_dir": str(out / f"M{M}_runtime")}, environ={})
    runner = Runner(rt, cfg, None, rt.train_batch_size())
    data = {"stock": train_gpt.tokens(margs, stock.device), "rt": train_gpt.tokens(margs, rt.device)}
    for name in VARIANTS:  # warm-up: allocator, NCCL communicators, kernels
        run_variant(name, stock, rt, runner, data, 2, on_gpu)
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for name in order if r % 2 == 0 else order[::-1]:
            per[name].append(statistics.median(run_variant(name, stock, rt, runner, data, args.steps, on_gpu)))
    result: dict[str, Any] = {"M": M, "median_iteration_s": {v: statistics.median(x) for v, x in per.items()},
                              "per_round_s": per}
    base = per["stock"]
    result["throughput_vs_stock"] = {
        v: {"median": statistics.median(b / x for b, x in zip(base, xs, strict=True)),
            "min": min(b / x for b, x in zip(base, xs, strict=True)),
            "max": max(b / x for b, x in zip(base, xs, strict=True))} for v, xs in per.items()}
    if args.torch_profile:  # every rank records its own (the iterations hold collectives)
        k = args.torch_profile
        for name in ("stock", "runtime"):
            profile(f"M{M}_{name}_rank{tdist.get_rank()}",
                    lambda n=name, a=stock, b=rt, r=runner: run_variant(n, a, b, r, data, k, on_gpu), out)
        result["profiled_iterations"] = k
    runner.log.close()
    del stock, rt, runner
    if on_gpu:
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--microbatches", default="8", help="comma-separated M values")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=8, help="iterations per variant per round")
    p.add_argument("--torch-profile", type=int, default=0, help="iterations to record with torch.profiler (0: off)")
    p.add_argument("--cpu", action="store_true", help="tiny model on CPU (gloo): checks the script's logic")
    args, model_args = p.parse_known_args(argv)
    on_gpu = not args.cpu and train_gpt.uses_gpu()
    distributed.init_distributed(on_gpu)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_args = [*(TINY if args.cpu else GPT2_H200), *model_args]
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if on_gpu else "cpu",
                              "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                              "model_args": model_args, "rounds": args.rounds, "steps": args.steps, "runs": []}
    for M in (int(m) for m in args.microbatches.split(",")):
        report["runs"].append(bench_m(args, model_args, M, out, on_gpu))
        if tdist.get_rank() == 0:
            (out / "ablation.json").write_text(json.dumps(report, indent=1) + "\n")
    if tdist.get_rank() == 0:
        lines = [f"# Engine ablation ({report['device']}, {report['started_utc']} UTC, measured)", "",
                 f"{args.rounds} rounds x {args.steps} iterations per variant, rotated order; throughput relative "
                 "to stock DeepSpeed 1F1B in the same round (median, min-max over rounds).", "",
                 "| M | variant | iteration (ms, median) | throughput vs stock |", "|---|---|---|---|"]
        for run in report["runs"]:
            for v in VARIANTS:
                r = run["throughput_vs_stock"][v]
                lines.append(f"| {run['M']} | {v} | {1e3 * run['median_iteration_s'][v]:.1f} | "
                             f"{r['median']:.4f} ({r['min']:.4f}-{r['max']:.4f}) |")
        (out / "ablation.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
    tdist.barrier()


if __name__ == "__main__":
    main()
    distributed.exit_process()

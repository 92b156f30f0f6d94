"""Stock DeepSpeed 1F1B vs the EnvPipe runtime, on the same model, in one process per stage.

Run under torchrun (one process per pipeline stage); clocks are never changed (the runtime records
clock requests only unless envpipe-clockd runs) and energy is the NVML counter (on CPU: simulated).

    torchrun --standalone --nproc-per-node 4 benchmarks/runtime_bench.py --out OUT --microbatches 4,8,16
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/runtime_bench.py --cpu --out OUT

For each M: both engines are built once (same seed, same weights), then ``--rounds`` times: stock
1F1B for ``--steps`` iterations, the EnvPipe engine alone in 1F1B order (no unit timing, no clock
client: what the engine itself costs), and the whole runtime in 1F1B order (calibration +
``--steps`` steady iterations): interleaved, and in reverse order every other round, so drift hits
all alike. Then the runtime in EnvPipe's order. From the
runtime's calibration at the default clock: predicted vs measured iteration time and per-stage unit
end times, and the plan the planner would deploy on a profile built from the measured unit times
and energies (other clocks simulated by the frequency model). Rank 0 writes OUT/bench.json after
every M (a run cut short keeps what it finished); `benchmarks/runtime_results.py` renders it.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import train_gpt  # noqa: E402  (examples/train_gpt.py: the model, the stock loop)

from envpipe.energy.meter import METER_PERIOD_S  # noqa: E402
from envpipe.plan.schedules import one_f_one_b  # noqa: E402
from envpipe.runtime import config as envpipe_config  # noqa: E402
from envpipe.runtime import distributed, replicas  # noqa: E402
from envpipe.runtime.clocks import Device, NvmlEnergyClock, SimClock, make_clock  # noqa: E402
from envpipe.runtime.runner import Runner  # noqa: E402
from envpipe.runtime.timing import StageTiming, predicted_timeline  # noqa: E402

TINY = ["--tiny"]
GPT2_H200 = [
    "--model",
    "gpt2",
    "--layers",
    "16",
    "--hidden",
    "2048",
    "--heads",
    "16",
    "--seq",
    "1024",
    "--micro-batch",
    "4",
]


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--microbatches", default="8", help="comma-separated M values")
    p.add_argument("--rounds", type=int, default=3, help="interleaved stock/runtime pairs per M")
    p.add_argument("--steps", type=int, default=15, help="measured iterations per run")
    p.add_argument("--calibration-steps", type=int, default=2)
    p.add_argument("--no-envpipe-order", action="store_true", help="skip the EnvPipe-order run")
    p.add_argument("--no-bare", action="store_true", help="skip the bare-engine run in each round")
    p.add_argument("--cpu", action="store_true", help="tiny model on CPU (gloo): checks the script's logic")
    args, model_args = p.parse_known_args(argv)
    args.ms = [int(m) for m in args.microbatches.split(",")]
    if any(m < 1 for m in args.ms) or args.rounds < 1 or args.steps < 1:
        p.error("M values, --rounds and --steps must be >= 1")
    return args, model_args


def runtime_run(
    engine: Any, data: Any, scheduling: str, report_dir: Path, steps: int, calibration_steps: int
) -> tuple[dict | None, Runner]:
    cfg = envpipe_config.parse(
        {"type": "baseline", "scheduling": scheduling, "report_dir": str(report_dir)}, environ={}
    )
    device = Device(engine.device.type == "cuda", engine.device.index or 0, engine.grid.get_data_parallel_id())
    clock = make_clock(cfg, device)
    try:
        return train_gpt.run_envpipe(engine, data, cfg, clock, engine.train_batch_size(), steps, calibration_steps)
    finally:
        if clock is not None:
            clock.close()


def stage_ends(runner: Runner, orders: list) -> dict[str, list[float]] | None:
    """Measured (last steady iteration) vs predicted end of every stage's last unit, from train_batch's start."""
    cal = runner.calibration
    assert runner.last_timing is not None and cal is not None
    gathered = replicas.gather((runner.place, runner.last_timing))
    if tdist.get_rank() != 0:
        return None
    timings: list[StageTiming] = [t for w, t in sorted(gathered, key=lambda x: x[0].stage) if w.replica == 0]
    t0 = timings[0].step_start
    measured = [max(b for *_, b in t.units) - t0 for t in timings]
    # the units' ends do not depend on the tails (they add to the iteration time only)
    stage_end = predicted_timeline(orders, cal).stage_end
    return {"measured_s": measured, "predicted_s": [float(x + cal.head_s) for x in stage_end]}


def deployable_plan(summary: dict, M: int, gpu: str, idle_w: float) -> dict:
    """The plan the planner would deploy on a profile from the measured units (lower clocks simulated)."""
    from envpipe.plan.planfile import evaluate_plan
    from envpipe.plan.planner import make_plan
    from envpipe.plan.render import text_trace
    from envpipe.profile.from_measured import profile_from_measured
    from envpipe.profile.gpus import GPU_FILTERS

    cal = summary["calibration"]
    energy = summary["unit_energy_per_stage"]
    rule = GPU_FILTERS[gpu]
    clocks = range(rule.max_mhz, rule.min_mhz - 1, -rule.granularity)
    profile = profile_from_measured(
        cal["fwd_s"], cal["bwd_s"], [e["F_j"] for e in energy], [e["B_j"] for e in energy], clocks
    )
    result = make_plan(
        profile,
        M,
        schedule="envpipe",
        policy="envelope",
        reconfig="balanced",
        idle_power_w=idle_w,
        gpu=gpu,
        transfer_s=cal["transfer_s"],
    )
    tail = np.asarray(cal["tail_s"])
    tl = evaluate_plan(result.plan, profile, idle_w, cal["transfer_s"], tail)
    from envpipe.plan.planfile import baseline_timeline

    base = baseline_timeline(profile, M, idle_w, cal["transfer_s"], tail)
    return {
        "label": "simulated: unit times/energies measured at the default clock, other clocks from the "
        "frequency model (A100 curve scaled to this GPU's clock range)",
        "idle_power_w": idle_w,
        "reschedule": result.reschedule,
        "valley_mhz": result.valley_mhz,
        "predicted_time_s": tl.iteration_time,
        "predicted_energy_j": tl.energy,
        "baseline_time_s": base.iteration_time,
        "baseline_energy_j": base.energy,
        "saving": 1 - tl.energy / base.energy,
        "slowdown": tl.iteration_time / base.iteration_time - 1,
        "trace": text_trace(result.timeline, result.reconfig.freqs_mhz),
        "plan": result.plan.to_json(),
    }


def _ratios(runs: list[dict], rounds: list[dict]) -> dict[str, Any]:
    """Throughput of ``runs`` over stock's, per interleaved round, with median and spread."""
    per_round = [x["stock"]["iteration_time_s"] / r["iteration_time_s"] for x, r in zip(rounds, runs, strict=True)]
    return {
        "per_round": per_round,
        "median": statistics.median(per_round),
        "min": min(per_round),
        "max": max(per_round),
    }


def idle_power(on_gpu: bool, seconds: float = 2.0) -> float:
    """This GPU's power while idle (NVML counter over ``seconds``, measured), before any run.

    The blocking power the planner charges for bubbles. Not the power seen in a pipeline's waits: the
    counter moves only every ~100 ms, so interpolated wait energy carries the neighbouring units' power.
    On CPU: the simulated GPU's idle power.
    """
    if not on_gpu:
        return SimClock().model.idle_power_w
    meter = NvmlEnergyClock(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        e0, t0 = meter.energy_j(), time.perf_counter()
        time.sleep(seconds)
        return (meter.energy_j() - e0) / (time.perf_counter() - t0)
    finally:
        meter.close()


def bench_m(args: argparse.Namespace, model_args: list[str], M: int, out: Path, idle_w: float) -> dict:
    margs = train_gpt.parse_args(
        [
            *model_args,
            "--microbatches",
            str(M),
            "--steps",
            str(args.steps),
            "--calibration-steps",
            str(args.calibration_steps),
        ]
    )
    stock = train_gpt.build_engine(margs, {}, "stock")
    rt = train_gpt.build_engine(margs, {}, "envpipe")
    data_s, data_r = train_gpt.tokens(margs, stock.device), train_gpt.tokens(margs, rt.device)
    samples = stock.train_batch_size()
    orders = one_f_one_b(rt.num_stages, M)
    rounds = []
    for r in range(args.rounds):
        # counterbalanced: the GPU's clock drifts with its power and heat within a round, so stock runs
        # first in even rounds and last in odd ones, and drift does not favour either side
        order = ["stock", "engine_1f1b", "runtime_1f1b"]
        got: dict[str, Any] = {"engine_1f1b": None}
        for name in order if r % 2 == 0 else order[::-1]:
            report_dir = out / f"M{M}" / f"{name}_r{r}"
            sargs = copy.copy(margs)
            sargs.report_dir = str(report_dir)
            if name == "stock":
                got[name] = train_gpt.run_stock(stock, data_s, sargs, samples)
            elif name == "engine_1f1b" and not args.no_bare:  # the EnvPipe engine alone: no timing, no clocks
                rt.set_unit_orders(orders)
                got[name] = train_gpt.run_stock(rt, data_r, sargs, samples)
                if got[name] is not None:
                    got[name]["engine"] = "envpipe-engine-1f1b (no timing, no clocks)"
            elif name == "runtime_1f1b":
                got[name], runner = runtime_run(rt, data_r, "1f1b", report_dir, args.steps, args.calibration_steps)
        rounds.append(got)
    result: dict[str, Any] = {"M": M, "rounds": rounds}
    last = rounds[-1]["runtime_1f1b"]
    ends = stage_ends(runner, orders)
    if not args.no_envpipe_order:
        e, _ = runtime_run(rt, data_r, "envpipe", out / f"M{M}" / "runtime_envpipe", args.steps, args.calibration_steps)
        result["runtime_envpipe"] = e
    if tdist.get_rank() == 0:
        result["throughput_ratio"] = _ratios([x["runtime_1f1b"] for x in rounds], rounds)
        if not args.no_bare:
            result["engine_ratio"] = _ratios([x["engine_1f1b"] for x in rounds], rounds)
        result["stage_ends"] = ends
        energy = last.get("unit_energy_per_stage") or []
        if energy and all(u and u.get("F_j") and u.get("B_j") for u in energy):
            gpu = "a100" if args.cpu else "h200"
            try:  # a planning error must not cost the measurements above
                result["deployable_plan"] = deployable_plan(last, M, gpu, idle_w)
            except Exception as exc:
                result["deployable_plan_error"] = repr(exc)
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
    idle_w = idle_power(on_gpu)  # on every rank; rank 0's GPU is the one reported
    bench: dict[str, Any] = {
        "idle_power_w": idle_w,
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
        res = bench_m(args, model_args, M, out, bench["idle_power_w"])
        res["wall_s"] = time.perf_counter() - t0
        bench["runs"].append(res)
        if tdist.get_rank() == 0:
            (out / "bench.json").write_text(json.dumps(bench, indent=1) + "\n")
            print(f"M={M} done in {res['wall_s']:.0f}s: throughput ratio {res['throughput_ratio']}", flush=True)
    tdist.barrier()


if __name__ == "__main__":
    main()
    distributed.exit_process()

"""Train one configuration found by `envpipe search` for real and write what it measured next to what the
search predicted (rank 0: ``--out``, JSON). Run under torchrun with the configuration's P x D processes:

    torchrun --standalone --nproc-per-node 2 benchmarks/search_run.py --out run.json -- --config found.json --steps 10
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/search_run.py --out run.json -- --config ...

The arguments after ``--`` are examples/train_gpt.py's. The job is built exactly as that script builds it
(train_gpt.build_engine after train_gpt.apply_found). Peak memory: the allocator's peak from before the
model is built through ``--memory-iterations`` iterations in the plan's order (torch.cuda's counters on
GPUs, torch's CPU allocator through the profiler's memory events on CPU: envpipe.runtime.layer_profile.
AllocationWindows), per stage the largest over its replicas. Iteration time: then the EnvPipe runtime
runs the plan (calibration, ``--steps`` steady iterations; its summary: per steady iteration the slowest
rank, median and least). Clocks: the sim clock on CPU runs the plan with its clocks; on GPUs without
envpipe-clockd the runtime runs 1F1B at default clocks and reports the plan (``ran``: "baseline"), to be
compared with the search's 1F1B all-max prediction. This script never changes clocks or power limits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import train_gpt  # noqa: E402  (examples/train_gpt.py: the model, the found configuration)

from envpipe.plan.planfile import Plan  # noqa: E402
from envpipe.runtime import collective, distributed, replicas  # noqa: E402
from envpipe.runtime import config as envpipe_config  # noqa: E402
from envpipe.runtime.clocks import Device, make_clock  # noqa: E402
from envpipe.runtime.layer_profile import AllocationWindows  # noqa: E402
from envpipe.runtime.runner import Runner  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--memory-iterations", type=int, default=2)
    bench, rest = p.parse_known_args()
    args = train_gpt.parse_args([a for a in rest if a != "--"])
    if not args.config:
        p.error("give examples/train_gpt.py's --config (a found configuration) after --")
    # the allocator setting the search's memory model holds for, as its printed launch command sets it
    allocator = train_gpt.read_config(args.config).get("envpipe_search", {}).get("allocator")
    if allocator:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", allocator)
    ds_config = train_gpt.apply_found(args, train_gpt.read_config(args.config), args.config)
    ds_config, cfg = envpipe_config.split(ds_config)
    # the plan alone: no interleaved 1F1B comparison iterations
    cfg = dataclasses.replace(cfg, report_dir=args.report_dir, compare_iterations=0)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    stages, dp = replicas.pipeline_shape(world, cfg.pipeline_stages)
    train_gpt.check_stage_layers(args, stages)
    on_gpu = train_gpt.uses_gpu()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    clock = make_clock(cfg, Device(on_gpu, local, replica=rank % dp))
    distributed.init_distributed(on_gpu)
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    assert cfg.plan is not None, "a found configuration carries its plan"
    try:
        with AllocationWindows(device) as probe, probe.window("train"):
            engine = train_gpt.build_engine(args, ds_config, "envpipe", stages)
            engine.set_unit_orders(Plan.load(cfg.plan).orders())
            data = train_gpt.tokens(args, engine.device)
            for _ in range(bench.memory_iterations):
                engine.train_batch(data)
        peaks = collective.gather((engine.stage_id, probe.peak("train")))
        summary = Runner(engine, cfg, clock, engine.train_batch_size()).train(data, args.steps,
                                                                              args.calibration_steps)
    finally:
        if clock is not None:
            clock.close()  # back to default clocks
    if summary is None:
        return
    found = train_gpt.read_config(args.config)["envpipe_search"]
    ran = "plan" if summary.plan is not None and summary.plan.deployed else "baseline"
    result = {
        "config": args.config,
        "shape": {"stages": stages, "replicas": dp, "micro_batch": args.micro_batch,
                  "microbatches": args.microbatches, "stage_layers": args.stage_layers},
        "predicted": found["predicted"],
        "predicted_label": found["label"],
        "measured": {
            "label": f"measured on {torch.cuda.get_device_name(device) if on_gpu else 'cpu'}, clock "
                     f"{summary.clock.kind}",
            "ran": ran,  # the plan (clocks under control), or 1F1B at default clocks (the plan reported only)
            "iteration_time_s": summary.steady.time_s.median,
            "iteration_time_least_s": summary.steady.time_s.min,
            "iterations": summary.steady.time_s.n,
            "peak_memory_bytes_per_stage": [max(b for s, b in peaks if s == stage) for stage in range(stages)],
            "memory_probe": "torch.cuda allocator peak" if on_gpu else "torch CPU allocator peak (profiler "
                            "memory events)",
            "runtime_predicted_iteration_time_s": summary.predicted_iteration_time_s,
            "calibration": dataclasses.asdict(summary.calibration) if summary.calibration else None,
        },
    }
    Path(bench.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"ran": ran, "predicted_s": found["predicted"]["iteration_time_s" if ran == "plan" else
                                                                   "baseline_iteration_time_s"],
                      "measured_s": summary.steady.time_s.median,
                      "peaks": result["measured"]["peak_memory_bytes_per_stage"],
                      "predicted_peaks": found["predicted"]["peak_memory_bytes_per_stage"]}))


if __name__ == "__main__":
    main()
    distributed.exit_process()

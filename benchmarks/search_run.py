"""Train one configuration found by `envpipe search` for real and write what it measured next to what the
search predicted (rank 0: ``--out``, JSON). Run under torchrun with the configuration's P x D processes:

    torchrun --standalone --nproc-per-node 2 benchmarks/search_run.py --out run.json -- --config found.json --steps 10
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 benchmarks/search_run.py --out run.json -- --config ...

The job is built as examples/train_gpt.py builds it from a found configuration: its model (envpipe.models.gpt,
the shape and stage cut of the configuration's `envpipe_search` block) on `envpipe.initialize`, the found
plan run by the EnvPipe runtime (calibration, then the plan; no comparison iterations); on GPUs the model is
built on its device (the same job, minutes sooner). Peak memory: the allocator's peak from before the model is
built to the end of the run, whose steady iterations run the plan's order (torch.cuda's counters on GPUs, torch's
CPU allocator through the profiler's memory events on CPU: envpipe.layerprof.profiler.AllocationWindows), per
stage the largest over its replicas; on GPUs also the device need, what must fit (the allocator's reserved peak
plus what the process holds outside the allocator at the end, cudaMemGetInfo: each rank alone on its GPU; that
part too), and the bytes of a graphed run's recordings' private pools, which its allocated peak does not count
(benchmarks/gpu_memory.py). Iteration time: the
runtime's summary (per steady iteration the slowest rank, median and least). Clocks: a simulated GPU on CPU runs
the plan with its clocks; on GPUs without envpipe-clockd the runtime runs the plan's order at default clocks
(``ran``: "order"), to be compared with the search's prediction at the top clock. This script never changes
clocks or power limits.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

import envpipe
from benchmarks.gpu_memory import graph_pool_bytes, outside_allocator_bytes
from envpipe.layerprof.profiler import AllocationWindows
from envpipe.models.gpt import counting, pipeline
from envpipe.runtime import distributed
from envpipe.runtime.entry import read_config
from envpipe.runtime.measure import collective
from envpipe.search.found import train_settings
from envpipe.search.layers import ModelShape


def parse() -> tuple[argparse.Namespace, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    bench, rest = p.parse_known_args()
    job = argparse.ArgumentParser(prog="search_run.py ... --")
    job.add_argument("--config", required=True, help="the found configuration")
    job.add_argument("--steps", type=int, default=10, help="training iterations (calibration included)")
    job.add_argument("--calibration-steps", type=int, default=2)
    job.add_argument("--report-dir", default="envpipe-report")
    return bench, job.parse_args([a for a in rest if a != "--"])


def main() -> None:
    bench, args = parse()
    config = read_config(None, args.config)  # its plan path made relative to the file
    found, plan = train_settings(config["envpipe_search"], config)
    assert plan is not None, "a found configuration carries its plan"
    if config["envpipe_search"].get("allocator"):  # the setting the search's memory model holds for
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", config["envpipe_search"]["allocator"])
    config["envpipe"] = {**config["envpipe"], "report_dir": args.report_dir, "compare_iterations": 0,
                         "calibration_iterations": args.calibration_steps}
    shape = ModelShape(found["model"], found["layers"], found["hidden"], found["heads"], found["seq"], found["vocab"])
    on_gpu = os.environ.get("DS_ACCELERATOR") != "cpu" and torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    distributed.init_distributed(on_gpu)
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    torch.manual_seed(1234)
    with AllocationWindows(device) as probe, probe.window("train"):
        with torch.device(device):  # built on its device: the same tensors, minutes sooner
            model = pipeline(shape, len(found["stage_layers"]), found["stage_layers"])
        engine = envpipe.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
                                    config=config)[0]
        data = counting(shape, found["micro_batch"], engine.device, seed=engine.grid.get_data_parallel_id())
        for _ in range(args.steps):
            engine.train_batch(data)
    peaks = collective.gather((engine.stage_id, {"peak_memory_bytes_per_stage": probe.peak("train"),
                                                  **_device_memory(device)}))
    summary = engine.envpipe_report()
    if summary is None:
        return
    stages = len(found["stage_layers"])
    block = config["envpipe_search"]
    info = summary.plan
    # the plan with its clocks; or, clocks not under control, its order at default clocks ("baseline" when that
    # order is 1F1B: the search's 1F1B all-max prediction applies)
    ran = "plan" if info is not None and info.deployed else "order" if info is not None and info.order_deployed \
        else "baseline"
    result = {
        "config": args.config,
        "shape": {"stages": stages, "replicas": summary.data_parallel, "micro_batch": found["micro_batch"],
                  "microbatches": found["microbatches"], "stage_layers": found["stage_layers"]},
        "predicted": block["predicted"],
        "predicted_label": block["label"],
        "measured": {
            "label": f"measured on {torch.cuda.get_device_name(device) if on_gpu else 'cpu'}, clock "
                     f"{summary.clock.kind}",
            "ran": ran,
            "iteration_time_s": summary.steady.time_s.median,
            "iteration_time_least_s": summary.steady.time_s.min,
            "iterations": summary.steady.time_s.n,
            "peak_memory_bytes_per_stage": _per_stage(peaks, "peak_memory_bytes_per_stage", stages),
            "memory_probe": "torch.cuda allocator peak" if on_gpu else "torch CPU allocator peak (profiler "
                            "memory events)",
            "runtime_predicted_iteration_time_s": summary.predicted_iteration_time_s,
        },
    }
    if on_gpu:
        keys = ("device_need_bytes_per_stage", "graph_pool_bytes_per_stage", "outside_allocator_bytes_per_stage")
        result["measured"] |= {key: _per_stage(peaks, key, stages) for key in keys}
        result["measured"]["cuda_graphs"] = bool(config["envpipe"].get("cuda_graphs"))
    Path(bench.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"ran": ran, "predicted_s": block["predicted"]["iteration_time_s" if ran == "plan" else
                                                                   "baseline_iteration_time_s"],
                      "measured_s": summary.steady.time_s.median,
                      "peaks": result["measured"]["peak_memory_bytes_per_stage"],
                      "predicted_peaks": block["predicted"]["peak_memory_bytes_per_stage"]}))


def _device_memory(device: torch.device) -> dict[str, int]:
    """On a GPU: the allocator's reserved peak plus what the process holds outside the allocator now (what must
    fit), the bytes of the recordings' private pools, and what is outside the allocator; on CPU nothing."""
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize(device)
    outside = outside_allocator_bytes(device)
    return {"device_need_bytes_per_stage": torch.cuda.memory_stats(device)["reserved_bytes.all.peak"] + outside,
            "graph_pool_bytes_per_stage": graph_pool_bytes(), "outside_allocator_bytes_per_stage": outside}


def _per_stage(rows: list[tuple[int, dict[str, int]]], key: str, stages: int) -> list[int]:
    """Per stage, the largest of one rank's measure over the stage's replicas."""
    return [max(row[key] for stage_of, row in rows if stage_of == stage) for stage in range(stages)]


if __name__ == "__main__":
    main()
    distributed.exit_process()

"""One rank of a tiny CPU (gloo) DeepSpeed pipeline, run as a real process by the runtime tests.

Usage: python pipe_worker.py SPEC OUT_DIR  (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; DeepSpeed's
launcher may add --local_rank=N, which is ignored). SPEC is JSON, or @FILE holding it:
{"stages": P, "runs": [{"name": str, "engine": "stock"|"envpipe"|"runtime", "M": int,
  "steps": int | "as:NAME" (as many iterations as run NAME trained), "orders": [[["F",0],...],...] | null,
  "zero": 0|1, "bf16": bool (optional), "envpipe": {envpipe block} (runtime only: envpipe.initialize, the
  report in OUT_DIR/NAME), "graphs": bool (optional: units replayed as recordings of the CPU recorder,
  tests/support/fakes/graphs.py)}]}. "stock": deepspeed.initialize; "envpipe": a bare EnvPipeEngine running "orders";
"runtime": envpipe.initialize, the runtime's phases inside the same plain loop of train_batch() calls.
With ENVPIPE_TEST_DEVICE=fake-gpu the runtime chooses its clock as on a GPU node (tests/support/fakes/nvml_module
first on PYTHONPATH makes NVML the fake's).
Each data-parallel replica draws its own batches. Writes OUT_DIR/rank<r>.json with losses and parameters;
runtime runs also write their report to OUT_DIR/<name>/.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
from deepspeed.pipe import PipelineModule

import envpipe
from envpipe.runtime import distributed
from envpipe.runtime.engine.engine import build
from tests.support.fakes.graphs import CpuGraphs

HIDDEN, MICRO = 8, 2


def batches(seed: int, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(MICRO, HIDDEN, generator=g)
        yield x.to(dtype), (x.sum(dim=1, keepdim=True).expand(-1, HIDDEN) * 0.1).to(dtype)


def make_engine(kind: str, stages: int, M: int, zero: int = 0, bf16: bool = False, block: dict | None = None):
    torch.manual_seed(1234)
    layers = [
        torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh()) for _ in range(2 * stages)
    ]
    model = PipelineModule(
        layers=layers, num_stages=stages, loss_fn=torch.nn.MSELoss(), partition_method="uniform"
    )
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": M,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if zero:
        config["zero_optimization"] = {"stage": zero}
        config["zero_allow_untested_optimizer"] = True  # torch SGD
    if bf16:
        config["bf16"] = {"enabled": True}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if kind == "stock":
        return deepspeed.initialize(model=model, optimizer=opt, config=config)[0]
    if kind == "envpipe":
        return build(model=model, optimizer=opt, config=config)
    return envpipe.initialize(model=model, optimizer=opt, config={**config, "envpipe": block})[0]


def train(engine, run: dict) -> list[float]:
    """Every iteration's loss (DeepSpeed broadcasts it to every stage): the user's plain loop."""
    it = batches(7 + engine.grid.get_data_parallel_id(), torch.bfloat16 if run.get("bf16") else torch.float32)
    losses = [float(engine.train_batch(it)) for _ in range(run["steps"])]  # "as:NAME" is resolved by main
    if run["engine"] == "runtime":
        engine.envpipe_report()  # the report over every steady iteration, as the examples end
    return losses


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    spec = json.loads(Path(args[0][1:]).read_text() if args[0].startswith("@") else args[0])
    out = Path(args[1])
    distributed.init_distributed(on_gpu=False)
    results = {}
    for run in spec["runs"]:
        if isinstance(run["steps"], str):
            run = {**run, "steps": len(results[run["steps"].removeprefix("as:")]["losses"])}
        block = {**run.get("envpipe", {}), "report_dir": str(out / run["name"])}
        engine = make_engine(run["engine"], spec["stages"], run["M"], run.get("zero", 0), run.get("bf16", False),
                             block)
        if run.get("orders") is not None:
            engine.set_unit_orders([[tuple(u) for u in o] for o in run["orders"]])
        recorder = CpuGraphs()
        if run.get("graphs"):
            engine.run_units_as_graphs(recorder)
        losses = train(engine, run)
        params = {n: p.detach().flatten().tolist() for n, p in engine.module.named_parameters()}
        results[run["name"]] = {"losses": losses, "params": params, "engine": type(engine).__name__,
                                "recorded": engine.graphs.recorded if run.get("graphs") else 0,
                                "replays": [recorder.forward_replays, recorder.backward_replays],
                                "recordings_made": recorder.recordings,
                                "released_after": recorder.released_after,
                                # BF16_Optimizer's gradient hand-off batched (envpipe.runtime.engine.hp_grads)
                                "hp_grads_batched": "update_hp_grads" in vars(engine.optimizer)}
    with open(out / f"rank{os.environ['RANK']}.json", "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main()
    distributed.exit_process()

"""One rank of a tiny CPU (gloo) DeepSpeed pipeline, run as a real process by test_runtime_pipeline.py.

Usage: python pipe_worker.py SPEC_JSON OUT_DIR  (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set).
SPEC: {"stages": P, "runs": [{"name": str, "engine": "stock"|"envpipe", "M": int, "steps": int,
       "orders": [[["F",0],...],...] | null}]}. Writes OUT_DIR/rank<r>.json with losses and parameters.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
from deepspeed.pipe import PipelineModule

from envpipe.runtime.engine import initialize

HIDDEN, MICRO = 8, 2


def batches(seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(MICRO, HIDDEN, generator=g)
        yield x, x.sum(dim=1, keepdim=True).expand(-1, HIDDEN) * 0.1


def make_engine(kind: str, stages: int, M: int):
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
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    init = deepspeed.initialize if kind == "stock" else initialize
    engine, *_ = init(model=model, optimizer=opt, config=config)
    return engine


def main() -> None:
    spec = json.loads(sys.argv[1])
    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for run in spec["runs"]:
        engine = make_engine(run["engine"], spec["stages"], run["M"])
        if run.get("orders") is not None:
            engine.set_unit_orders([[tuple(u) for u in o] for o in run["orders"]])
        it = batches(7)
        losses = [float(engine.train_batch(it)) for _ in range(run["steps"])]
        params = {n: p.detach().flatten().tolist() for n, p in engine.module.named_parameters()}
        results[run["name"]] = {"losses": losses, "params": params, "engine": type(engine).__name__}
    with open(os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.json"), "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main()

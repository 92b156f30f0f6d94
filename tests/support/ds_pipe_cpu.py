"""A tiny self-contained 2-stage DeepSpeed pipeline on CPU (gloo), started by the launcher tests.

Usage: ds_pipe_cpu.py OUT_DIR (the last argument; DeepSpeed inserts --local_rank first).
Each rank writes OUT_DIR/rank<r>.txt with its world size, network namespace (so a test can tell
the nodes apart), final loss and $ENVPIPE_TEST_MARK (how a test sees that --env reached it).
Process groups start and end through envpipe.runtime.distributed.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
from deepspeed.pipe import LayerSpec, PipelineModule
from torch import nn

from envpipe.runtime import distributed

STEPS = 3


def batches():
    g = torch.Generator().manual_seed(0)
    while True:
        x = torch.randn(8, 16, generator=g)
        yield x, x.sum(dim=1, keepdim=True)


def main() -> None:
    distributed.init_distributed(on_gpu=False)
    torch.manual_seed(0)
    layers = [
        LayerSpec(nn.Linear, 16, 16),
        LayerSpec(nn.ReLU),
        LayerSpec(nn.Linear, 16, 16),
        LayerSpec(nn.ReLU),
        LayerSpec(nn.Linear, 16, 1),
    ]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=nn.MSELoss(), partition_method="type:Linear")
    config = {
        "train_batch_size": 16 * (torch.distributed.get_world_size() // 2),
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    it = batches()
    loss = None
    for _ in range(STEPS):
        loss = engine.train_batch(data_iter=it)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    netns = os.stat("/proc/self/ns/net").st_ino
    with open(os.path.join(sys.argv[-1], f"rank{rank}.txt"), "w") as f:
        mark = os.environ.get("ENVPIPE_TEST_MARK")
        f.write(f"rank {rank} world {world} netns {netns} loss {float(loss):.6f} mark {mark}\n")
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
    distributed.exit_process()

"""Train a small CNN with DeepSpeed's pipeline engine, written the way DeepSpeed's pipeline tutorial writes it,
with EnvPipe: the `envpipe.initialize` line is the only change from the stock DeepSpeed script.

    deepspeed examples/train_cnn.py --deepspeed_config ds_config.json --steps 200          # GPUs
    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 examples/train_cnn.py \
        --deepspeed_config examples/ds_config_cnn.json --steps 40                            # CPU, gloo

The images are synthetic (nothing is downloaded): CIFAR-10's shape, 10 classes, each class a fixed random
pattern under noise, so the loss falls within a few dozen steps. `--checkpoint-dir` saves a checkpoint every
`--save-every` steps and resumes from the latest one there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import deepspeed
import torch
from deepspeed.pipe import PipelineModule

import envpipe


class SyntheticImages(torch.utils.data.Dataset):
    """CIFAR-10-shaped images (3 x 32 x 32, 10 classes): a fixed pattern per class plus noise."""

    def __init__(self, size: int = 4096, classes: int = 10, noise: float = 1.0, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(classes, 3, 32, 32, generator=g)
        self.labels = torch.randint(0, classes, (size,), generator=g)
        self.noise = noise
        self.seed = seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = self.labels[index]
        return self.patterns[label] + self.noise * torch.randn(3, 32, 32, generator=g), label


def cnn_layers(classes: int = 10) -> list:
    """The network as a flat list of layers, as PipelineModule takes it."""
    return [
        torch.nn.Conv2d(3, 32, kernel_size=3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, kernel_size=3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 64, kernel_size=3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        lambda x: torch.flatten(x, 1),
        torch.nn.Linear(64 * 4 * 4, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, classes),
    ]


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A small CNN on DeepSpeed's pipeline engine")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by DeepSpeed's launcher")
    parser.add_argument("-s", "--steps", type=int, default=100, help="training steps (train_batch calls)")
    parser.add_argument("-p", "--pipeline-parallel-size", type=int, default=2, help="pipeline stages")
    parser.add_argument("--seed", type=int, default=1138, help="seed of the model's initial weights")
    parser.add_argument("--checkpoint-dir", type=Path, help="save checkpoints here and resume from the latest")
    parser.add_argument("--save-every", type=int, default=0, help="save a checkpoint every N steps (0: at the end)")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main() -> None:
    args = get_args()
    deepspeed.init_distributed()
    torch.manual_seed(args.seed)
    net = PipelineModule(layers=cnn_layers(), loss_fn=torch.nn.CrossEntropyLoss(),
                         num_stages=args.pipeline_parallel_size, partition_method="parameters")
    engine, _, _, _ = envpipe.initialize(args=args, model=net,
                                         model_parameters=[p for p in net.parameters() if p.requires_grad],
                                         training_data=SyntheticImages())
    if args.checkpoint_dir is not None and (args.checkpoint_dir / "latest").exists():
        engine.load_checkpoint(args.checkpoint_dir)
    while engine.global_steps < args.steps:
        loss = engine.train_batch()
        if engine.global_rank == 0:
            print(f"step {engine.global_steps}/{args.steps} loss {loss.item():.6f}", flush=True)
        if args.checkpoint_dir is not None and args.save_every and engine.global_steps % args.save_every == 0:
            engine.save_checkpoint(args.checkpoint_dir)
    if args.checkpoint_dir is not None and not args.save_every:
        engine.save_checkpoint(args.checkpoint_dir)


if __name__ == "__main__":
    main()

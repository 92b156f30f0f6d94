"""Train a GPT-style model (Hugging Face GPT-2 or Llama configuration, randomly initialised) split
into DeepSpeed pipeline layers, on synthetic tokens, with the EnvPipe runtime or stock DeepSpeed.

    torchrun --nproc-per-node 2 examples/train_gpt.py --model gpt2 --steps 10            # GPUs
    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 examples/train_gpt.py --tiny --steps 3   # CPU, gloo
    torchrun --nproc-per-node 4 examples/train_gpt.py --pipeline-stages 2 --zero-stage 1    # DP2 x PP2, ZeRO-1

The runtime's policy is `optimal` by default: least energy within the iteration-time budget (no slowdown
against this run's own 1F1B all-max iterations unless --max-slowdown or --time-budget), the unit order
chosen within memory. The `envpipe` block of --config sets the same options (envpipe/runtime/config.py);
the flags below override it, and ENVPIPE_TYPE / ENVPIPE_SCHEDULING / ENVPIPE_RECONFIGURE / ENVPIPE_CLOCK
override both. --plan runs a plan file. --engine stock runs DeepSpeed's own PipelineEngine for comparison.
Nothing is downloaded: only configurations are built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import deepspeed
import torch
import torch.distributed as tdist
from deepspeed.pipe import LayerSpec, PipelineModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envpipe.runtime import collective, distributed, replicas
from envpipe.runtime import config as envpipe_config
from envpipe.runtime.clocks import Clock, ClockUnavailable, Device, NvmlEnergyClock, make_clock, make_meter
from envpipe.runtime.collect import RankRecord, assemble
from envpipe.runtime.engine import initialize
from envpipe.runtime.iterations import BASELINE
from envpipe.runtime.report import write_report
from envpipe.runtime.runner import Runner
from envpipe.runtime.summary import RunSummary
from envpipe.runtime.textreport import render


class Embedding(torch.nn.Module):
    """Token (+ learned position for GPT-2) embeddings: input ids -> hidden states."""

    def __init__(self, cfg, learned_positions: bool) -> None:
        super().__init__()
        hidden = cfg.hidden_size
        self.tokens = torch.nn.Embedding(cfg.vocab_size, hidden)
        self.positions = (
            torch.nn.Embedding(cfg.max_position_embeddings, hidden) if learned_positions else None
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tokens(ids)
        if self.positions is not None:
            h = h + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return h


class Block(torch.nn.Module):
    """One transformer block of the chosen family: hidden states -> hidden states (causal)."""

    def __init__(self, cfg, family: str, index: int) -> None:
        super().__init__()
        self.block: torch.nn.Module
        if family == "gpt2":
            from transformers.models.gpt2.modeling_gpt2 import GPT2Block

            self.block, self.rotary = GPT2Block(cfg, layer_idx=index), None
        else:
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

            self.block, self.rotary = LlamaDecoderLayer(cfg, layer_idx=index), LlamaRotaryEmbedding(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.rotary is None:
            out = self.block(h)
        else:
            pos = torch.arange(h.shape[1], device=h.device)[None]
            out = self.block(h, position_embeddings=self.rotary(h, pos), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out


class Head(torch.nn.Module):
    def __init__(self, cfg, family: str) -> None:
        super().__init__()
        self.norm = (
            torch.nn.LayerNorm(cfg.hidden_size) if family == "gpt2" else torch.nn.RMSNorm(cfg.hidden_size)
        )
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def model_config(args: argparse.Namespace) -> Any:
    """The Hugging Face config of the chosen family (GPT2Config or LlamaConfig)."""
    if args.model == "gpt2":
        from transformers import GPT2Config

        cfg: Any = GPT2Config(
            n_embd=args.hidden,
            n_layer=args.layers,
            n_head=args.heads,
            n_positions=args.seq,
            vocab_size=args.vocab,
            bos_token_id=0,
            eos_token_id=0,
        )
    else:
        from transformers import LlamaConfig

        cfg = LlamaConfig(
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.heads,
            vocab_size=args.vocab,
            max_position_embeddings=args.seq,
            bos_token_id=0,
            eos_token_id=0,
        )
    cfg._attn_implementation = "sdpa"
    return cfg


def layer_specs(args: argparse.Namespace) -> list[LayerSpec]:
    """The pipeline's layers: embedding, one per transformer block, head (args.layers + 2)."""
    cfg = model_config(args)
    layers = [LayerSpec(Embedding, cfg, args.model == "gpt2")]
    layers += [LayerSpec(Block, cfg, args.model, i) for i in range(args.layers)]
    layers.append(LayerSpec(Head, cfg, args.model))
    return layers


def pipeline(args: argparse.Namespace, stages: int) -> PipelineModule:
    layers = layer_specs(args)
    if args.stage_layers:
        return CutPipelineModule(args.stage_layers, layers=layers, num_stages=stages, loss_fn=lm_loss)
    return PipelineModule(layers=layers, num_stages=stages, loss_fn=lm_loss, partition_method="type:Block")


class CutPipelineModule(PipelineModule):
    """A PipelineModule with an explicit stage cut: ``counts[s]`` consecutive layers on stage s (DeepSpeed's
    `parts` boundaries, given instead of computed by a partition method)."""

    def __init__(self, counts: list[int], **kwargs) -> None:
        self._counts = list(counts)
        super().__init__(**kwargs)

    def _partition_layers(self, method: str = "uniform") -> None:
        self.parts = [sum(self._counts[:s]) for s in range(len(self._counts) + 1)]
        if self.global_rank == 0:  # as DeepSpeed's own partitioning reports it
            print(" ".join(f"stage={s} layers={c}" for s, c in enumerate(self._counts)))
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


def tokens(args: argparse.Namespace, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    while True:
        ids = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1), generator=g)
        yield ids[:, :-1].to(device), ids[:, 1:].to(device)


def run_stock(engine, data: Iterator, args: argparse.Namespace, cfg: envpipe_config.EnvPipeConfig,
              samples: int) -> RunSummary | None:
    """DeepSpeed's own PipelineEngine (1F1B), timed and metered as the runtime's steady iterations are (the same
    NVML counter, interpolated at iteration boundaries); the same summary type, engine "stock-deepspeed-1f1b"."""
    on_gpu = engine.device.type == "cuda"
    energy = NvmlEnergyClock(engine.device.index or 0) if on_gpu else None
    meter = make_meter(energy)
    for _ in range(args.calibration_steps):
        engine.train_batch(data)
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    spans = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        engine.train_batch(data)
        if on_gpu:
            torch.cuda.synchronize()
        spans.append((t0, time.perf_counter()))
    joules: list[float | None] = [None] * len(spans)
    if meter is not None and meter.wait_until(spans[-1][1]):
        joules = [float(meter.trace.between(a, b)) for a, b in spans]
    steady = [(BASELINE, b - a, j) for (a, b), j in zip(spans, joules, strict=True)]  # stock: 1F1B, default clocks
    peak = torch.cuda.max_memory_allocated() if on_gpu else None
    record = RankRecord(collective.place(engine), steady, peak, None, [], "stock", [], [], [])
    everyone = collective.gather(record)
    for closing in (meter, energy):
        if closing is not None:
            closing.close()
    if tdist.get_rank() != 0:
        return None
    summary = assemble(everyone, cfg, energy, None, None, None, None, samples, engine.micro_batches, None,
                       engine="stock-deepspeed-1f1b")
    write_report(args.report_dir, summary)
    return summary


ENVIRONMENT = """environment:
  ENVPIPE_TYPE          the policy (optimal, baseline, uniform, envelope); overrides --policy and the config
  ENVPIPE_SCHEDULING    1f1b, or envpipe (the planner may choose EnvPipe's extra warm-up forwards)
  ENVPIPE_RECONFIGURE   default (none), greedy, balanced (EnvPipe's), replan (the optimal policy's default)
  ENVPIPE_CLOCK         auto, sim (CPU), daemon (envpipe-clockd, or stop with one line), none
  ENVPIPE_CLOCKD_SOCKET the clock daemon's socket (default /run/envpipe/clockd.sock)
  DS_ACCELERATOR=cpu    train on CPU processes over gloo (clocks simulated)"""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _OneLineParser(description=__doc__.split("\n\n")[0], epilog=ENVIRONMENT,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per iteration (M)")
    p.add_argument("--steps", type=int, default=10, help="measured (steady) iterations")
    p.add_argument("--calibration-steps", type=int, default=2)
    p.add_argument("--policy", choices=envpipe_config.TYPES, help="the runtime policy (envpipe.type; default optimal)")
    p.add_argument("--max-slowdown", type=float, help="budget: this run's 1F1B all-max iteration x (1 + this)")
    p.add_argument("--time-budget", type=float, help="budget: an iteration time in seconds")
    p.add_argument("--memory-limit-gib", type=float,
                   help="memory per GPU for in-flight activations' order choice (default: the GPU's; CPU: none)")
    p.add_argument("--profile-points", type=int, help="clocks profiled online (default 4)")
    p.add_argument("--reconfigure-rounds", type=int, help="most reconfiguration rounds (default 5)")
    p.add_argument("--compare-iterations", type=int,
                   help="steady 1F1B all-max iterations interleaved with the plan's, for the measured saving (10)")
    p.add_argument("--tiny", action="store_true", help="a tiny model for CPU smoke runs")
    p.add_argument(
        "--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on GPU, fp32 on CPU"
    )
    p.add_argument("--config", help="DeepSpeed JSON config, may hold an 'envpipe' block")
    p.add_argument("--plan", help="plan JSON to run (skips profiling and planning)")
    p.add_argument("--clock", choices=envpipe_config.CLOCKS, help="clock backend (overrides the config)")
    p.add_argument("--engine", choices=["envpipe", "stock"], default="envpipe")
    p.add_argument(
        "--pipeline-stages",
        type=int,
        default=None,
        help="pipeline stages; data-parallel replicas = processes / stages (default: one stage per process, "
        "or envpipe.pipeline_stages)",
    )
    p.add_argument("--zero-stage", type=int, choices=[0, 1], default=None, help="ZeRO stage (1: optimizer states)")
    p.add_argument("--report-dir", default="envpipe-report")
    p.add_argument(
        "--stage-layers",
        type=_counts,
        default=None,
        help="layers per pipeline stage, e.g. 5,5: a cut over the pipeline's --layers + 2 layers (embedding, "
        "blocks, head); default: DeepSpeed balances the blocks",
    )
    p.add_argument(
        "--profile-layers",
        metavar="PATH",
        help="measure every layer of this model (time and memory per micro-batch size) into a layer profile "
        "for `envpipe search`, then exit (one process; clocks untouched)",
    )
    p.add_argument("--profile-micro-batches", type=_counts, default=[1, 2, 4], help="micro-batch sizes to profile")
    # DeepSpeed's launcher (deepspeed, envpipe-launch) adds --local_rank=N; LOCAL_RANK says the same
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.heads, args.seq, args.vocab, args.micro_batch = 4, 32, 2, 16, 128, 2
    names = ("layers", "hidden", "heads", "seq", "vocab", "micro_batch", "microbatches", "steps")
    for name in names:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.pipeline_stages is not None and args.pipeline_stages < 1:
        p.error("--pipeline-stages must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.profile_layers:
        profile_layers(args)
        return
    try:
        ds_config = apply_found(args, read_config(args.config) if args.config else {}, args.config)
        ds_config, cfg = envpipe_config.split(ds_config)
        limit = None if args.memory_limit_gib is None else int(args.memory_limit_gib * 2**30)
        flags = {"plan": args.plan, "clock": args.clock, "type": args.policy, "max_slowdown": args.max_slowdown,
                 "time_budget_s": args.time_budget, "memory_limit_bytes": limit, "profile_points": args.profile_points,
                 "reconfigure_rounds": args.reconfigure_rounds, "compare_iterations": args.compare_iterations}
        overrides = {k: v for k, v in flags.items() if v is not None}
        overrides["report_dir"] = args.report_dir
        cfg = envpipe_config.parse({**_block(cfg), **overrides})
        # the launcher's WORLD_SIZE: a bad shape stops the job before any process group starts
        world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
        stages, dp = replicas.pipeline_shape(world, args.pipeline_stages or cfg.pipeline_stages)
        check_stage_layers(args, stages)
        on_gpu = uses_gpu()
        # the clock is decided before the model is built: a job that cannot have the clocks it asked for
        # stops now, with one line (DeepSpeed's grid is pipe-major: a rank's replica is rank % replicas)
        device = Device(on_gpu, int(os.environ.get("LOCAL_RANK", "0")), replica=rank % dp)
        clock = make_clock(cfg, device, replicas.sim_slowdown(device.replica)) if args.engine == "envpipe" else None
    except (OSError, ValueError, ClockUnavailable) as exc:  # before any process group: a plain exit is safe
        print(f"train_gpt.py: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        distributed.init_distributed(on_gpu)
        train(args, ds_config, cfg, stages, clock)
    except Exception as exc:  # the traceback for the log, then the one line a user reads first
        traceback.print_exc()
        print(f"train_gpt.py: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        if clock is not None:
            clock.close()
        distributed.exit_process(1)
    if clock is not None:
        clock.close()  # back to default clocks


def train(
    args: argparse.Namespace, ds_config: dict, cfg: envpipe_config.EnvPipeConfig, stages: int, clock: Clock | None
) -> None:
    """Build the engine and train: stock DeepSpeed, or the EnvPipe runtime (rank 0 prints the report)."""
    engine = build_engine(args, ds_config, args.engine, stages)
    data = tokens(args, engine.device)
    samples = engine.train_batch_size()
    if args.engine == "stock":
        summary = run_stock(engine, data, args, cfg, samples)
    else:
        summary = Runner(engine, cfg, clock, samples).train(data, args.steps, args.calibration_steps)
    if summary is not None:
        print(render(summary, args.report_dir))


def read_config(path: str) -> dict:
    """The DeepSpeed JSON config, or a ValueError that names the file and the reason."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config {path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: a DeepSpeed config is a JSON object")
    return data


def uses_gpu() -> bool:
    return os.environ.get("DS_ACCELERATOR") != "cpu" and torch.cuda.is_available()


def build_engine(args: argparse.Namespace, ds_config: dict, engine: str = "envpipe", stages: int | None = None):
    """A pipeline engine over all ranks: stock DeepSpeed's or the EnvPipe runtime's.

    ``stages``: pipeline stages (default: one per rank); the other axis is data parallelism (ZeRO: --zero-stage).
    """
    ds_config = dict(ds_config)
    dtype = args.dtype or ("bf16" if uses_gpu() else "fp32")
    ds_config.setdefault("train_micro_batch_size_per_gpu", args.micro_batch)
    ds_config.setdefault("gradient_accumulation_steps", args.microbatches)
    ds_config.setdefault("steps_per_print", 10**9)
    if dtype == "bf16":
        ds_config.setdefault("bf16", {"enabled": True})
    if args.zero_stage is not None:
        ds_config["zero_optimization"] = {**ds_config.get("zero_optimization", {}), "stage": args.zero_stage}
    torch.manual_seed(1234)
    model = pipeline(args, stages or tdist.get_world_size())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # a torch optimizer: no JIT-built ops
    init = deepspeed.initialize if engine == "stock" else initialize
    return init(model=model, optimizer=optimizer, config=ds_config)[0]


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by commas") from None
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be >= 1")
    return counts


def apply_found(args: argparse.Namespace, ds_config: dict, config_path: str | None) -> dict:
    """A configuration found by `envpipe search`: its `envpipe_search` block sets the model, the micro-batch
    size and count and the stage cut (removed before DeepSpeed sees the config); its plan path is relative
    to the config file."""
    from envpipe.search.found import FoundConfigError, train_settings

    if "envpipe_search" not in ds_config:
        return ds_config
    ds_config = dict(ds_config)
    try:
        settings, plan = train_settings(ds_config.pop("envpipe_search"), ds_config)
    except FoundConfigError as exc:
        raise ValueError(f"--config {config_path}: {exc}") from None
    for key, value in settings.items():
        setattr(args, key, value)
    if plan is not None and config_path is not None:
        ds_config["envpipe"] = {**ds_config["envpipe"], "plan": str(Path(config_path).parent / plan)}
    return ds_config


def check_stage_layers(args: argparse.Namespace, stages: int) -> None:
    """--stage-layers must cut all layers of the pipeline into exactly its stages (a ValueError otherwise)."""
    cut = args.stage_layers
    if cut is None:
        return
    if sum(cut) != args.layers + 2 or len(cut) != stages:
        raise ValueError(
            f"--stage-layers {','.join(map(str, cut))} cuts {sum(cut)} layers into {len(cut)} stages; the "
            f"pipeline has {args.layers + 2} layers (embedding, {args.layers} blocks, head) and {stages} stages"
        )


def profile_layers(args: argparse.Namespace) -> None:
    """Measure every pipeline layer of this model on this process's device (--profile-layers)."""
    from envpipe.runtime.layer_profile import Target, profile_layers
    from envpipe.search.layers import ModelShape

    on_gpu = uses_gpu()
    local = args.local_rank or int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    torch.manual_seed(1234)
    shape = ModelShape(args.model, args.layers, args.hidden, args.heads, args.seq, args.vocab)

    def batch(b: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return next(tokens(argparse.Namespace(vocab=args.vocab, seq=args.seq, micro_batch=b), dev))

    target = Target([spec.build for spec in layer_specs(args)], batch, lm_loss, shape)
    dtype = args.dtype or ("bf16" if on_gpu else "fp32")
    profile = profile_layers(target, args.profile_micro_batches, device, dtype, progress=print)
    profile.save(args.profile_layers)
    print(f"layer profile ({profile.device}, {dtype}, micro-batch sizes {profile.micro_batch_sizes}) written to "
          f"{args.profile_layers}")


def _block(cfg: envpipe_config.EnvPipeConfig) -> dict:
    return {k: v for k, v in vars(cfg).items() if v is not None}


if __name__ == "__main__":
    main()
    distributed.exit_process()  # no interpreter finalization racing gloo's threads (envpipe.runtime.distributed)

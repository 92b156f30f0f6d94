"""Train a GPT-style model (Hugging Face GPT-2 or Llama configuration, randomly initialised) split into DeepSpeed
pipeline layers, with EnvPipe (envpipe.initialize) or stock DeepSpeed (--engine stock), in an ordinary loop.

    torchrun --nproc-per-node 2 examples/train_gpt.py --model gpt2 --steps 100                  # GPUs
    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 examples/train_gpt.py --tiny --steps 30        # CPU, gloo
    torchrun --nproc-per-node 4 examples/train_gpt.py --pipeline-stages 2 --zero-stage 1          # DP2 x PP2

The data is synthetic and has structure (nothing is downloaded): each sequence counts up from a random token
with a stride of 1, 2 or 3, so the loss falls as the model learns to continue it. EnvPipe's options come from
the `envpipe` block of the DeepSpeed config (--deepspeed_config), the flags below, and ENVPIPE_* variables
(which override both); --deepspeed_config may be a configuration found by `envpipe search`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, get_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import envpipe
from envpipe.limits import MAX_MICROBATCHES, output_path_error, parse_slowdown
from envpipe.runtime import CALIBRATION_LEAST, ClockKind, EnvPipeConfig

NORMAL = {"layers": 16, "hidden": 2048, "heads": 16, "seq": 1024, "vocab": 50304, "micro_batch": 4}
TINY = {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 128, "micro_batch": 2}
ENVIRONMENT = """environment:
  ENVPIPE_TYPE          the policy (optimal, baseline, uniform, envelope); overrides --policy and the config
  ENVPIPE_SCHEDULING    1f1b, or envpipe (the planner may choose EnvPipe's extra warm-up forwards)
  ENVPIPE_RECONFIGURE   default (none), greedy, balanced (EnvPipe's), replan (the optimal policy's default)
  ENVPIPE_CLOCK         auto, sim (CPU), sim-readonly (CPU, clocks that cannot be set), daemon (envpipe-clockd,
                        or stop with one line), readonly, none
  ENVPIPE_CLOCKD_SOCKET the clock daemon's socket (default /run/envpipe/clockd.sock)
  DS_ACCELERATOR=cpu    train on CPU processes over gloo (clocks simulated)"""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by commas") from None
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be >= 1")
    return counts


def _positive(kind: type, most: float = float("inf")) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a positive finite number")
        if value > most:
            raise argparse.ArgumentTypeError(f"{text!r}: at most {most:g}")
        return value
    return parse


def _slowdown(text: str) -> float:
    try:
        return parse_slowdown(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _default(field: str) -> Any:
    """The runtime's default of an 'envpipe' config key, for the help texts (one source of truth)."""
    return EnvPipeConfig.model_fields[field].default


def _output(text: str) -> str:
    why = output_path_error(text)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return text


def parser() -> argparse.ArgumentParser:
    """The script's command line (every option with its help: tests/runtime/test_example.py checks)."""
    p = _OneLineParser(description=__doc__.split("\n\n")[0], epilog=ENVIRONMENT,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"envpipe {envpipe.__version__}")
    model = p.add_argument_group("model (defaults: GPT-2 XL-like; --tiny: a tiny one for CPU runs)")
    model.add_argument("--model", choices=["gpt2", "llama"], default="gpt2", help="the block family")
    model.add_argument("--layers", type=_positive(int, 4096), help=f"transformer blocks (default {NORMAL['layers']})")
    model.add_argument("--hidden", type=_positive(int, 2**17), help=f"hidden size (default {NORMAL['hidden']})")
    model.add_argument("--heads", type=_positive(int, 4096), help=f"attention heads (default {NORMAL['heads']})")
    model.add_argument("--seq", type=_positive(int, 2**20), help=f"sequence length (default {NORMAL['seq']})")
    model.add_argument("--vocab", type=_positive(int, 2**23), help=f"vocabulary size (default {NORMAL['vocab']})")
    model.add_argument("--tiny", action="store_true", help="tiny defaults for the sizes not given: "
                       + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in TINY.items()))
    model.add_argument("--dtype", choices=["bf16", "fp32"], help="default: bf16 on GPU, fp32 on CPU")
    train = p.add_argument_group("training")
    train.add_argument("--micro-batch", type=_positive(int, 2**16), help=f"sequences per micro-batch (default "
                       f"{NORMAL['micro_batch']})")
    train.add_argument("--microbatches", type=_positive(int, MAX_MICROBATCHES), default=8,
                       help="micro-batches per iteration (M)")
    train.add_argument("--steps", type=_positive(int), default=30, help="training iterations (train_batch calls)")
    train.add_argument("--lr", type=_positive(float), default=1e-3, help="AdamW learning rate")
    train.add_argument("--pipeline-stages", type=_positive(int), help="pipeline stages; data-parallel replicas = "
                       "processes / stages (default: one stage per process)")
    train.add_argument("--stage-layers", type=_counts, help="layers per pipeline stage, e.g. 5,5: a cut over the "
                       "--layers + 2 layers (embedding, blocks, head); default: DeepSpeed balances the blocks")
    train.add_argument("--zero-stage", type=int, choices=[0, 1], help="ZeRO stage (1: optimizer states)")
    train.add_argument("--engine", choices=["envpipe", "stock"], default="envpipe",
                       help="envpipe.initialize, or stock deepspeed.initialize (timed and metered alike)")
    # DeepSpeed's own flags (deepspeed.add_config_arguments), declared here so that --help needs no DeepSpeed
    train.add_argument("--deepspeed_config", "--config", dest="deepspeed_config", metavar="JSON",
                       help="DeepSpeed config; its 'envpipe' block configures EnvPipe (may be `envpipe search`'s "
                       "found.json)")
    train.add_argument("--deepspeed", action="store_true", help="accepted for DeepSpeed's launcher (no effect)")
    train.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # DeepSpeed's launcher
    ep = p.add_argument_group("EnvPipe (each sets the config's 'envpipe' key in brackets)")
    ep.add_argument("--policy", choices=["optimal", "baseline", "uniform", "envelope"],
                    help=f"[type] default {_default('type')}")
    ep.add_argument("--clock", choices=get_args(ClockKind), help=f"[clock] default {_default('clock')}")
    ep.add_argument("--rehearse", action="store_true", default=None, help="[rehearse] where clocks cannot be set: "
                    "stretch each unit by its planned clock's extra time and measure the plan against 1F1B")
    ep.add_argument("--cuda-graphs", action="store_true", default=None, help="[cuda_graphs] replay each stage's "
                    "forwards and backwards as CUDA graphs (GPUs): units the host's issuing sets the pace of take the "
                    "device's time")
    ep.add_argument("--plan", help="[plan] run this plan file (no profiling, no planning)")
    ep.add_argument("--max-slowdown", type=_slowdown, help="[max_slowdown] budget: this run's 1F1B all-max "
                    "iteration x (1 + this); a fraction or a percent: 0.05 or 5%%")
    ep.add_argument("--time-budget", type=float, help="[time_budget_s] budget: an iteration time in seconds")
    ep.add_argument("--memory-limit-gib", type=_positive(float), help="[memory_limit_bytes] memory per GPU for the "
                    "order choice (default: the GPU's; CPU: none)")
    ep.add_argument("--calibration-steps", type=int, help="[calibration_iterations] a fixed count (default: until the "
                    f"iteration time settles, {CALIBRATION_LEAST} to {_default('calibration_max_iterations')})")
    ep.add_argument("--profile-points", type=int, help="[profile_points] clocks profiled online "
                    f"(default {_default('profile_points')})")
    ep.add_argument("--reconfigure-rounds", type=int,
                    help=f"[reconfigure_rounds] default {_default('reconfigure_rounds')}")
    ep.add_argument("--compare-iterations", type=int, help="[compare_iterations] 1F1B all-max iterations "
                    f"interleaved with the plan's, for the measured saving (default {_default('compare_iterations')})")
    ep.add_argument("--report-dir", help=f"[report_dir] default {_default('report_dir')}")
    ep.add_argument("--log-interval", type=int, help="[log_interval] a progress line every N iterations")
    prof = p.add_argument_group("layer profile (for `envpipe search`)")
    prof.add_argument("--profile-layers", metavar="PATH", type=_output, help="measure every layer of this model "
                      "(time and memory per micro-batch size) into a layer profile, then exit (one process; clocks "
                      "untouched)")
    prof.add_argument("--profile-micro-batches", type=_counts, default=[1, 2, 4], help="micro-batch sizes to profile")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    defaults = TINY if args.tiny else NORMAL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    return args


BLOCK_FLAGS = {"policy": "type", "clock": "clock", "plan": "plan", "max_slowdown": "max_slowdown",
               "time_budget": "time_budget_s", "calibration_steps": "calibration_iterations",
               "profile_points": "profile_points", "reconfigure_rounds": "reconfigure_rounds",
               "compare_iterations": "compare_iterations", "report_dir": "report_dir", "log_interval": "log_interval",
               "rehearse": "rehearse", "cuda_graphs": "cuda_graphs"}


def deepspeed_config(args: argparse.Namespace) -> dict[str, Any]:
    """The job's DeepSpeed config: the file's (a found configuration sets the model), the flags on top."""
    from envpipe.runtime import read_config

    config = read_config(None, args.deepspeed_config) if args.deepspeed_config else {}  # a found plan: beside it
    block = dict(config.get("envpipe") or {})
    if "envpipe_search" in config:
        apply_found(args, config)
    if args.pipeline_stages is None and isinstance(block.get("pipeline_stages"), int):
        args.pipeline_stages = block["pipeline_stages"]
    block.update({key: getattr(args, flag) for flag, key in BLOCK_FLAGS.items() if getattr(args, flag) is not None})
    if args.memory_limit_gib is not None:
        block["memory_limit_bytes"] = int(args.memory_limit_gib * 2**30)
    if args.engine == "envpipe":
        block.setdefault("progress_total", args.steps)
        config["envpipe"] = block
    config.setdefault("train_micro_batch_size_per_gpu", args.micro_batch)
    config.setdefault("gradient_accumulation_steps", args.microbatches)
    config.setdefault("steps_per_print", 10**9)
    if (args.dtype or ("bf16" if uses_gpu() else "fp32")) == "bf16":
        config.setdefault("bf16", {"enabled": True})
    if args.zero_stage is not None:
        config["zero_optimization"] = {**config.get("zero_optimization", {}), "stage": args.zero_stage}
    return config


def apply_found(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """A configuration found by `envpipe search`: its `envpipe_search` block sets the model, the micro-batch size
    and count and the stage cut (envpipe.initialize removes the block before DeepSpeed sees the config)."""
    from envpipe.search.found import FoundConfigError, train_settings

    try:
        settings, _ = train_settings(config["envpipe_search"], config)
    except FoundConfigError as exc:
        raise ValueError(f"--deepspeed_config {args.deepspeed_config}: {exc}") from None
    for key, value in settings.items():
        setattr(args, key, value)
    args.pipeline_stages = len(settings["stage_layers"])


def uses_gpu() -> bool:
    import torch

    return os.environ.get("DS_ACCELERATOR") != "cpu" and torch.cuda.is_available()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.profile_layers:
        profile_layers(args)
        return
    from envpipe.runtime import check_config, exit_process, init_distributed, pipeline_shape

    try:
        config = deepspeed_config(args)
        if args.engine == "envpipe":  # a bad `envpipe` block, ENVPIPE_* variable, plan or profile stops it here
            check_config(config)
        world = int(os.environ.get("WORLD_SIZE", "1"))  # a bad shape stops the job before any process group
        stages, _ = pipeline_shape(world, args.pipeline_stages)
        check_stage_layers(args, stages)
    except (OSError, ValueError) as exc:
        fail(exc)
    init_distributed(uses_gpu())
    try:
        train(args, config, stages)
    except (OSError, ValueError, RuntimeError) as exc:
        fail(exc, exit_process)
    exit_process()  # no interpreter finalization racing gloo's threads (envpipe.runtime.distributed)


def fail(exc: BaseException, exit: Any = None) -> NoReturn:
    """One line on stderr (the job's error, not a traceback), then leave with status 2."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    sys.stderr.write(f"train_gpt.py: error: {message}\n")  # one write: ranks' lines never run into each other
    sys.stderr.flush()
    if exit is not None:
        exit(2)
    raise SystemExit(2)


def train(args: argparse.Namespace, config: dict[str, Any], stages: int) -> None:
    """Build the model, initialise the engine, run the loop; rank 0 prints the report."""
    import deepspeed
    import torch

    from envpipe.models.gpt import counting, pipeline
    from envpipe.runtime import StockRecorder, render_report

    torch.manual_seed(1234)
    model = pipeline(shape(args), stages, args.stage_layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # a torch optimizer: no JIT-built ops
    init = deepspeed.initialize if args.engine == "stock" else envpipe.initialize
    engine, *_ = init(model=model, optimizer=optimizer, config=config)
    data = counting(shape(args), args.micro_batch, engine.device, seed=engine.grid.get_data_parallel_id())
    report_dir = (config.get("envpipe") or {}).get("report_dir", args.report_dir or "envpipe-report")
    stock = StockRecorder(engine, report_dir) if args.engine == "stock" else None
    for _ in range(args.steps):
        (stock or engine).train_batch(data)
    summary = stock.finish() if stock is not None else engine.envpipe_report()
    if summary is not None:
        print(render_report(summary, report_dir), flush=True)


def shape(args: argparse.Namespace) -> Any:
    """The model's shape (envpipe.search.layers.ModelShape, as the layer profiler records it)."""
    from envpipe.search.layers import ModelShape

    return ModelShape(args.model, args.layers, args.hidden, args.heads, args.seq, args.vocab)


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
    import torch

    from envpipe.layerprof.profiler import Measurement, Target, profile_layers
    from envpipe.models.gpt import counting, layer_specs, lm_loss

    on_gpu = uses_gpu()
    local = args.local_rank or int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    torch.manual_seed(1234)
    model = shape(args)

    def batch(b: int, dev: Any) -> tuple[Any, Any]:
        return next(counting(model, b, dev))

    target = Target([spec.build for spec in layer_specs(model)], batch, lm_loss, model)
    dtype = args.dtype or ("bf16" if on_gpu else "fp32")
    profile = profile_layers(target, Measurement(args.profile_micro_batches, dtype), device, progress=print)
    profile.save(args.profile_layers)
    print(f"layer profile ({profile.device}, {dtype}, micro-batch sizes {profile.micro_batch_sizes}) written to "
          f"{args.profile_layers}")


if __name__ == "__main__":
    main()

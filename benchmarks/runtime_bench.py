"""Stock DeepSpeed against EnvPipe's drop-in engine, each run the way a user runs it: examples/train_gpt.py (or
the DeepSpeed-tutorial CNN, examples/train_cnn.py) under torchrun, one process per GPU, each engine in processes of
its own (so peak memory is each engine's own).

    python benchmarks/runtime_bench.py --out OUT --gpus 1 --models gpt2-16x2048,llama-12x3072 --rounds 2
    python benchmarks/runtime_bench.py --out OUT --gpus 2 --pipeline-stages 1 --zero-stage 1   # DP 2 x PP 1
    python benchmarks/runtime_bench.py --out OUT --cpu                      # tiny model, 2 CPU processes

Per model, ``--rounds`` rounds, each running stock DeepSpeed (`--engine stock`, timed and metered by
envpipe.runtime.stock) and the drop-in engine (`envpipe.initialize` held to DeepSpeed's 1F1B order,
ENVPIPE_SCHEDULING=1f1b), in reverse order every other round so that drift favours neither. Then
``--plan-runs`` runs of the drop-in engine as a user gets it (engine `envpipe-plan`: its default policy, which
may choose EnvPipe's order, interleaved with ``--plan-compare`` 1F1B iterations, then what the no-harm rule keeps),
and ``--rehearse-runs`` of the same with `rehearse` (engine `envpipe-rehearse`: the plan's units stretched by their
planned clocks' extra time, in pairs with 1F1B iterations, before the order's pairs). The CNN (`cnn`) has no
stock variant in its script: only the drop-in engine's runs. Clocks are never changed:
without envpipe-clockd the engine's clock is 'auto', which on a GPU leaves clocks at default and reads the NVML
energy counter, so the drop-in engine's steady iterations run their order with every clock at its default, and
its summary checks the energy model and the time prediction against the counter. Writes OUT/machine.txt,
OUT/bench.json and each run's report folder (summary.json, iterations.rank*.jsonl, the log);
`benchmarks/runtime_results.py dropin` renders them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_gpt.py"
MODELS = {
    "gpt2-16x2048": ["--model", "gpt2", "--layers", "16", "--hidden", "2048", "--heads", "16", "--seq", "1024",
                     "--micro-batch", "4"],
    "llama-12x3072": ["--model", "llama", "--layers", "12", "--hidden", "3072", "--heads", "24", "--seq", "2048",
                      "--micro-batch", "2"],
    "gpt2-12x1024": ["--model", "gpt2", "--layers", "12", "--hidden", "1024", "--heads", "16", "--seq", "1024",
                     "--micro-batch", "4"],
    "llama-16x2048": ["--model", "llama", "--layers", "16", "--hidden", "2048", "--heads", "16", "--seq", "2048",
                      "--micro-batch", "2"],
    "tiny": ["--tiny"],
}
CNN, CNN_CPU = "cnn", "cnn-tiny"  # examples/train_cnn.py (its own script and DeepSpeed config), no stock variant
CNN_SCRIPT = ROOT / "examples" / "train_cnn.py"
CNN_CONFIG = ROOT / "examples" / "ds_config_cnn.json"
ENGINES = ("stock", "envpipe")  # the throughput pair; the drop-in engine held to 1F1B (PAIR_SCHEDULING)
PAIR_SCHEDULING = "1f1b"
PLAN_ENGINE = "envpipe-plan"  # the drop-in engine's default policy and order, clocks untouched
REHEARSE_ENGINE = "envpipe-rehearse"  # the same, with the plan rehearsed first (`rehearse`)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="a new folder for the runs")
    p.add_argument("--models", default="gpt2-16x2048", help=f"comma-separated, of: {', '.join([*MODELS, CNN])}")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per iteration (M)")
    p.add_argument("--gpus", type=int, default=1, help="processes (GPUs); one pipeline stage each")
    p.add_argument("--rounds", type=int, default=2, help="stock/drop-in pairs per model")
    p.add_argument("--steps", type=int, default=20, help="training iterations per run")
    p.add_argument("--calibration-steps", type=int, default=None,
                   help="the drop-in engine's calibration iterations (default: the runtime's)")
    p.add_argument("--plan-runs", type=int, default=0, help="runs per model of the drop-in engine's default policy "
                   "(its order deployed, clocks untouched), after the pairs")
    p.add_argument("--rehearse-runs", type=int, default=0, help="runs per model of the default policy with "
                   "`rehearse` (the plan's units stretched by their planned clocks' extra time), after the plan runs")
    p.add_argument("--plan-compare", type=int, default=2, help="1F1B iterations interleaved with a plan run's")
    p.add_argument("--pipeline-stages", type=int, default=None, help="pipeline stages (default: one per GPU); the "
                   "other processes are data-parallel replicas")
    p.add_argument("--zero-stage", type=int, choices=[0, 1], default=None, help="ZeRO stage of every engine")
    p.add_argument("--cpu", action="store_true", help="tiny models on 2 CPU processes: checks the script")
    args = p.parse_args(argv)
    names = args.models.split(",")
    args.model_names = [CNN_CPU if m == CNN else "tiny" for m in names] if args.cpu else names
    unknown = [m for m in args.model_names if m not in MODELS and m not in (CNN, CNN_CPU)]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if min(args.steps, args.gpus, args.microbatches) < 1 or args.rounds < 0 or \
            args.steps <= (args.calibration_steps or 0):
        p.error("--gpus, --microbatches must be >= 1, --rounds >= 0 and --steps above --calibration-steps")
    if min(args.plan_runs, args.rehearse_runs, args.plan_compare) < 0:
        p.error("--plan-runs, --rehearse-runs and --plan-compare must be >= 0")
    if args.out.exists():
        p.error(f"{args.out} exists: give a new folder")
    return args


def run(args: argparse.Namespace, model: str, rnd: int, engine: str) -> dict:
    """One training job of one engine; its report folder holds summary.json, the JSON lines and its log."""
    folder = args.out / model / f"round{rnd}-{engine}"
    folder.mkdir(parents=True)
    nproc = 2 if args.cpu else args.gpus
    compare = args.plan_compare if engine in (PLAN_ENGINE, REHEARSE_ENGINE) else 0
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    if model in (CNN, CNN_CPU):
        cmd = [*launch, str(CNN_SCRIPT), *cnn_args(args, folder, compare, engine, nproc)]
    else:
        cmd = [*launch, str(EXAMPLE), *MODELS[model], "--microbatches", str(args.microbatches), "--steps",
               str(args.steps), "--engine", "stock" if engine == "stock" else "envpipe", "--report-dir", str(folder),
               "--compare-iterations", str(compare), "--log-interval", "1"]
        if args.calibration_steps is not None:
            cmd += ["--calibration-steps", str(args.calibration_steps)]
        if args.pipeline_stages is not None:
            cmd += ["--pipeline-stages", str(args.pipeline_stages)]
        if args.zero_stage is not None:
            cmd += ["--zero-stage", str(args.zero_stage)]
        if engine == REHEARSE_ENGINE:
            cmd.append("--rehearse")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
                                                       if args.cpu else {})}
    env.pop("ENVPIPE_SCHEDULING", None)
    if engine == "envpipe":
        env["ENVPIPE_SCHEDULING"] = PAIR_SCHEDULING
    if args.cpu:  # a simulated GPU whose clocks cannot be set: the lent GPUs' case (no clock daemon)
        env["ENVPIPE_CLOCK"] = "sim-readonly"
    t0 = time.monotonic()
    with (folder / "log.txt").open("w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    print(f"{time.strftime('%H:%M:%S')} {model} round {rnd} {engine}: exit {rc}, {time.monotonic() - t0:.0f} s",
          flush=True)
    return {"model": model, "round": rnd, "engine": engine, "folder": str(folder.relative_to(args.out)), "exit": rc,
            "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", "")}


def cnn_args(args: argparse.Namespace, folder: Path, compare: int, engine: str, nproc: int) -> list[str]:
    """examples/train_cnn.py's arguments: its DeepSpeed config (examples/ds_config_cnn.json) with M micro-batches,
    this run's report folder and EnvPipe settings, written into the run's folder."""
    config = json.loads(CNN_CONFIG.read_text())
    stages = args.pipeline_stages or nproc
    config["train_batch_size"] = config["train_micro_batch_size_per_gpu"] * args.microbatches * (nproc // stages)
    block = {**config.get("envpipe", {}), "report_dir": str(folder), "compare_iterations": compare,
             "log_interval": 1, "summary_interval": 10, "progress_total": args.steps,
             **({"rehearse": True} if engine == REHEARSE_ENGINE else {}),
             **({"calibration_iterations": args.calibration_steps} if args.calibration_steps is not None else {})}
    config["envpipe"] = block
    path = folder / "ds_config.json"
    path.write_text(json.dumps(config, indent=1) + "\n")
    return ["--deepspeed_config", str(path), "-p", str(stages), "--steps", str(args.steps)]


MACHINE = """import platform, torch, deepspeed, transformers
print(platform.node(), platform.platform(), "python", platform.python_version())
print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)"""


def machine(args: argparse.Namespace) -> str:
    """The date, the host, the software, and on GPUs what nvidia-smi says (read-only queries)."""
    parts = [time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
             subprocess.run([sys.executable, "-c", MACHINE], capture_output=True, text=True).stdout.strip()]
    if not args.cpu:
        parts.append(subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,power.limit,clocks.sm,clocks.max.sm,memory.total",
             "--format=csv"], capture_output=True, text=True).stdout.strip())
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True)
    (args.out / "machine.txt").write_text(machine(args))
    runs = []
    plan = []  # per model: its pairs, then its plan runs (a call cut short keeps whole models)
    for model in args.model_names:
        engines = ("envpipe",) if model in (CNN, CNN_CPU) else ENGINES  # the CNN script has no stock variant
        plan += [(model, rnd, engine) for rnd in range(args.rounds)
                 for engine in (engines if rnd % 2 == 0 else engines[::-1])]
        plan += [(model, rnd, PLAN_ENGINE) for rnd in range(args.plan_runs)]
        plan += [(model, rnd, REHEARSE_ENGINE) for rnd in range(args.rehearse_runs)]
    for model, rnd, engine in plan:
        runs.append(run(args, model, rnd, engine))
        (args.out / "bench.json").write_text(json.dumps(
            {"command": " ".join(["python", "benchmarks/runtime_bench.py", *(argv or sys.argv[1:])]),
             "gpus": 2 if args.cpu else args.gpus, "microbatches": args.microbatches,
             "pipeline_stages": args.pipeline_stages, "zero_stage": args.zero_stage,
             "pair_scheduling": PAIR_SCHEDULING, "runs": runs},
            indent=1) + "\n")  # after every run: a run cut short keeps what it finished
    return 1 if any(r["exit"] for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())

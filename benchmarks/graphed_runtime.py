"""The runtime's units replayed as CUDA graphs (envpipe.runtime.engine.graphs) against eager units, on found
configurations trained before (issue #38): iteration time and its spread, unit times, peak device memory and
the losses, eager and graphed side by side in one call.

    python benchmarks/graphed_runtime.py run --out OUT [--deadline-s 500] CONFIG...    # on a GPU
    python benchmarks/graphed_runtime.py render RAW                                      # the results file
    python benchmarks/graphed_runtime.py render-dropin RAW   # examples/train_gpt.py on the runtime, both ways

run: first the recorder against eager autograd on this GPU (``check.json``: two transformer blocks, three
micro-batches in flight, every gradient compared); then per found configuration (CONFIG: a found.json of
`envpipe search`, e.g. call6's held-out ones), one training run eager and one graphed, each in a child process of
its own (benchmarks/search_accuracy.py's runs: a bare EnvPipe engine running the plan's order, units timed by
CUDA events, the device synchronized after every iteration, the same warm-up and timed iterations both ways,
the declared ones of call6). Writes OUT/<model>/b<b>_{eager,graphed}.json as each run ends. No run starts after
``--deadline-s``. Clocks and power limits are never changed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.search_accuracy import Children, timed_iterations  # noqa: E402

DECLARED = ROOT / "benchmarks" / "results" / "search_accuracy" / "call6" / "shapes.json"  # its iterations
MODES = ("eager", "graphed")


def check(out: Path, device: str = "cuda", recorder: Any = None) -> None:
    """The CUDA recorder's replays against eager autograd on two GPT-2 blocks without dropout in fp32 (TF32 off, so
    that only the order of sums may differ): outputs, the inputs' and the parameters' gradients, three micro-batches
    in flight in 1F1B's pattern. ``device`` and ``recorder``: the CPU check's."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    from envpipe.models.gpt import layer_specs
    from envpipe.runtime.engine.graphs import CudaGraphs, StageGraphs
    from envpipe.search.layers import ModelShape

    recorder = recorder or CudaGraphs()

    shape = ModelShape("gpt2", 2, 256, 4, 128, 512)
    order = [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    results = []
    for graphed in (False, True):
        torch.manual_seed(0)
        with torch.device(device):
            stage = torch.nn.Sequential(*(s.build() for s in layer_specs(shape)[1:3]))
        for module in stage.modules():  # transformers' GPT-2 drops out 10 %: both ways would draw other masks
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        graphs = StageGraphs(stage, recorder) if graphed else None
        g = torch.Generator(device=device).manual_seed(1)
        xs = [torch.randn(2, shape.seq, shape.hidden, device=device, generator=g).requires_grad_() for _ in range(4)]
        outs, seen = {}, []
        for kind, mb in order:
            if kind == "F":
                if graphs is None:
                    outs[mb] = stage(xs[mb])
                else:
                    with graphs.forward_slot(mb):
                        outs[mb] = stage(xs[mb])
                seen.append(outs[mb].detach().clone())
            else:
                outs[mb].backward(torch.full_like(outs[mb], 0.01 * (mb + 1)))
                if graphs is not None:
                    graphs.backward_done(mb)
        if device == "cuda":
            torch.cuda.synchronize()
        results.append(seen + [x.grad for x in xs] + [p.grad for p in stage.parameters()])
    names = ([f"output {mb}" for kind, mb in order if kind == "F"] + [f"input grad {mb}" for mb in range(4)]
             + [f"grad {n}" for n, _ in stage.named_parameters()])
    diffs = {name: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
             for name, a, b in zip(names, *results, strict=True)}
    out.write_text(json.dumps({"dtype": "float32, TF32 off", "tensors": len(diffs),
                               "max_relative_difference": max(diffs.values()),
                               "identical": sum(d == 0 for d in diffs.values()), "per_tensor": diffs}) + "\n")


def run(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    # in a process of its own: the runs are forked from this one, which must not hold a CUDA context
    subprocess.run([sys.executable, __file__, "check", str(args.out / "check.json")], check=False)
    if (args.out / "check.json").exists():
        print(f"check: {(args.out / 'check.json').read_text().strip()[:300]}", flush=True)
    import deepspeed  # noqa: F401  (the heavy imports once, before the runs are forked)

    import envpipe.models.gpt  # noqa: F401
    deadline = time.monotonic() + args.deadline_s
    children, port = Children(), 29700
    iterations = json.loads(DECLARED.read_text())["iterations"]
    for config in args.configs:
        found = json.loads(config.read_text())["envpipe_search"]
        m = found["model"]
        here = args.out / f"{m['family']}_{m['layers']}x{m['hidden']}_s{m['seq']}"  # call6's names
        here.mkdir(exist_ok=True)
        for mode in MODES:
            if time.monotonic() > deadline:
                print(f"{config}: {mode} not run, the call's deadline is near", flush=True)
                continue
            port += 1
            stem = f"b{found['micro_batch']}_{mode}"
            spec = {"kind": "train", "config": str(config.resolve()), "out": str(here / f"{stem}.json"), "port": port,
                    "allocator": found.get("allocator", ""), "graphs": mode == "graphed",
                    **timed_iterations(iterations, found["predicted"]["baseline_iteration_time_s"])}
            t0 = time.monotonic()
            ok = children.run(spec, here / f"{stem}.log")
            print(f"{here.name} {stem}: {'done' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s", flush=True)


def _units(run: dict[str, Any], kind: str) -> float:
    return statistics.median(end - start for iteration in run["measured"]["units_per_iteration"]
                             for k, _, start, end in iteration if k == kind)


def render(paths: list[Path]) -> str:
    """The results file from one call's raw folder (``paths[0]``)."""
    raw = paths[0].resolve()
    check_ = json.loads((raw / "check.json").read_text())
    machine = (raw / "machine.txt").read_text().strip().splitlines()
    rows, table = [], []
    for here in sorted(p for p in raw.iterdir() if p.is_dir()):
        for eager_file in sorted(here.glob("b*_eager.json"), key=lambda p: int(p.name[1:].split("_")[0])):
            eager, graphed = (json.loads(f.read_text()) for f in (eager_file, Path(str(eager_file).replace(
                "_eager", "_graphed"))))
            t = [[1e3 * s for s in r["measured"]["iteration_s"]] for r in (eager, graphed)]
            med = [statistics.median(x) for x in t]
            spread = [100 * (max(x) / min(x) - 1) for x in t]
            peak = [r["measured"]["memory"]["device_peak_bytes"] / 2**30 for r in (eager, graphed)]
            loss = max(abs(a - b) / abs(a) for a, b in zip(eager["measured"]["losses"], graphed["measured"]["losses"],
                                                         strict=True))
            predicted = 1e3 * eager["predicted"]["baseline_iteration_time_s"]
            rows.append((here.name, eager["micro_batch"], med, spread, peak))
            units = [f"{1e3 * _units(eager, kind):.1f} / {1e3 * _units(graphed, kind):.1f}" for kind in "FB"]
            table.append(
                f"| {here.name} | {eager['micro_batch']} | {eager['microbatches']} | {med[0]:.1f} ({min(t[0]):.0f}-"
                f"{max(t[0]):.0f}, {spread[0]:.0f} %) | {med[1]:.1f} ({min(t[1]):.0f}-{max(t[1]):.0f}, "
                f"{spread[1]:.0f} %) | {med[0] / med[1]:.2f} | {units[0]} | {units[1]} | {peak[0]:.2f} / "
                f"{peak[1]:.2f} | {loss:.1e} | {predicted:.1f}: {100 * (predicted - med[0]) / med[0]:+.1f} %, "
                f"{100 * (predicted - med[1]) / med[1]:+.1f} % |")
    faster = [r for r in rows if r[2][0] / r[2][1] >= 1.1]
    level = [r for r in rows if r not in faster]
    lines = ["# Units replayed as CUDA graphs in the runtime, against eager units (one GPU)", "",
             f"Rendered by `python benchmarks/graphed_runtime.py render {raw.relative_to(ROOT)}` from the raw files "
             "there (each run's JSON and log, `machine.txt`, `nvidia-smi -q` before and `-d PERFORMANCE` after, "
             "`run.log`). **Measured** " + machine[0] + " on one " + machine[-1].split(",")[0] + f" ({machine[6]}, "
             f"code at {machine[5].removeprefix('commit ')}), by `benchmarks/graphed_runtime_gpu.sh`. Clocks and power "
             "limits were never changed.", "",
             "Each configuration is one that `envpipe search` found and that was trained eagerly before "
             "([search_accuracy_call6.md](search_accuracy_call6.md)'s held-out set; P = 1, D = 1, bf16, global batch "
             "16), trained here twice, one run after the other: eager, and with the runtime's `cuda_graphs` "
             "(envpipe.runtime.engine.graphs: the stage's forward and backward recorded at their first use and "
             "replayed). Both ways run the same warm-up and timed iterations, the device synchronized after every "
             "iteration, units timed by CUDA events. Time and memory only: a bare engine has no energy meter, so "
             "no energy was measured and the search's energy predictions are not scored here.", "",
             f"Before the runs, the recorder against eager autograd on this GPU (two GPT-2 blocks without dropout, "
             f"{check_['dtype']}, three micro-batches in flight in 1F1B's pattern): {check_['identical']} of "
             f"{check_['tensors']} outputs and gradients identical, the largest difference "
             f"{check_['max_relative_difference']:.2g} of the tensor's largest value.", "",
             "| model | b | M | iteration eager: median (min-max, spread) ms | graphed | eager / graphed | "
             "forward unit eager / graphed (ms) | backward unit eager / graphed (ms) | "
             "device peak eager / graphed (GiB) | largest loss difference | the search's (eager) prediction (ms) "
             "and its error: eager, graphed |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *table, "", "## What the runs show", "",
             f"- Graphed iterations were at least 10 % faster on {len(faster)} of {len(rows)} configurations: "
             + ", ".join(f"{m} b = {b} ({e / g:.2f}x)" for m, b, (e, g), _, _ in faster) + ". Elsewhere the two "
             "agree within " + f"{max(abs(g / e - 1) for _, _, (e, g), _, _ in level) * 100:.1f} %" + " (the device "
             "sets the pace there).",
             f"- Spread of the timed iterations (slowest over fastest) where graphs were faster: eager "
             f"{min(r[3][0] for r in faster):.0f}-{max(r[3][0] for r in faster):.0f} %, graphed "
             f"{min(r[3][1] for r in faster):.0f}-{max(r[3][1] for r in faster):.0f} %.",
             f"- Device peak, graphed against eager: {min(r[4][1] - r[4][0] for r in rows):+.2f} to "
             f"{max(r[4][1] - r[4][0] for r in rows):+.2f} GiB (each recording keeps its own memory pool).",
             "- Losses: GPT-2's blocks drop out 10 % (transformers' default), so the two runs draw different masks "
             "and their losses agree only as far as that allows; Llama's have no dropout, and their losses differ "
             "only by bf16's rounding.",
             "- A graphed backward still runs per parameter, eagerly: the gradient's copy out of the recording, its "
             "accumulation and DeepSpeed's BF16_Optimizer hook. Where the backward unit stays well above twice the "
             "forward (GPT-2 at b = 1), that host work is what is left of the host's pace.",
             "- The search's predictions are still the eager time model's: they do not yet know graphed units "
             "(issue #38's next step: a time model for them, then a declared held-out round).", ""]
    return "\n".join(lines) + "\n"


def render_dropin(paths: list[Path]) -> str:
    """The results file of examples/train_gpt.py run on the runtime (envpipe.initialize, every phase) eager and with
    --cuda-graphs, one after the other, one section per call (``paths``: each call's folder, with
    {eager,graphed}/summary.json, the runs' reports, and call.txt)."""
    roots = [p.resolve() for p in paths]
    lines = ["# `cuda_graphs` on the runtime: examples/train_gpt.py eager and graphed", "",
             "Rendered by `python benchmarks/graphed_runtime.py render-dropin "
             + " ".join(str(r.relative_to(ROOT)) for r in roots) + "` from the raw files there (each run's report "
             "folder and log, `nvsmi_after.txt`, `call.txt`: the call's command, written after it from the session's "
             "record). **Measured**; no clock daemon ran: the runtime read the NVML energy counter and never "
             "changed a clock.", "",
             "The user's path, not a bare engine: `examples/train_gpt.py` on `envpipe.initialize` with every phase "
             "(calibration, profiling at the one clock it has, the plan decided and the no-harm rule, steady "
             "iterations; the numbers are the runtime's own report's), GPT-2 with 8 blocks of 768, sequence 1,024, "
             "micro-batch 2, 8 micro-batches, 40 steps; once as it is and once with `--cuda-graphs`, one after the "
             "other.", ""]
    for raw in roots:
        lines += _dropin_call(raw)
    return "\n".join(lines) + "\n"


def _dropin_call(raw: Path) -> list[str]:
    runs = {m: json.loads((raw / m / "summary.json").read_text()) for m in MODES}
    first = json.loads((raw / "eager" / "iterations.rank0.jsonl").read_text().splitlines()[0])["wall_time"]
    when = datetime.fromtimestamp(first, UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = re.search(r"commit (\w+)", (raw / "call.txt").read_text())
    stages = runs["eager"]["stages"]
    rows = []
    for mode, r in runs.items():
        t, e = r["steady"]["time_s"], r["steady"]["energy_j"]
        order = r["plan"]["order"] if r.get("verdict") is None or r["verdict"]["kept"] else "1f1b (no harm)"
        peaks = " / ".join(f"{g['peak_memory_bytes'] / 2**20:.0f}" for g in r["gpus"])
        rows.append(f"| {mode} | {order} | {1e3 * t['median']:.1f} ({1e3 * t['q1']:.1f}-{1e3 * t['q3']:.1f}, "
                    f"n = {t['n']}) | {r['steady']['throughput_samples_per_s']:.1f} | {e['median']:.2f} | "
                    f"{1e3 * r['predicted_iteration_time_s']:.1f} ({100 * r['time_error']:+.1f} %) | "
                    f"{100 * r['energy']['error']:+.1f} % | {'held' if r['trust']['trusted'] else 'not trusted'} | "
                    f"{peaks} |")
    eager, graphed = (runs[m]["steady"] for m in MODES)
    saving = 1 - graphed["energy_j"]["median"] / eager["energy_j"]["median"]
    speedup = eager["time_s"]["median"] / graphed["time_s"]["median"]
    lines = [f"## {stages} pipeline stage{'s' if stages > 1 else ''} on {len(runs['eager']['gpus'])} NVIDIA H200 "
             f"({raw.name}: first iteration {when}, code at {commit.group(1) if commit else 'unknown'})", "",
             "| run | order that ran | steady iteration: median (IQR) ms | samples/s | energy per iteration, median "
             "(J, NVML counter) | the runtime's predicted iteration (ms) and its error | energy model's error | "
             "the report's predictions | peak memory per GPU (MiB) |", "|---|---|---|---|---|---|---|---|---|", *rows,
             "", f"- Graphed against eager, both measured in this call: iteration {speedup:.2f}x faster, energy per "
             f"iteration {100 * saving:.1f} % lower.",
             f"- The runtime's own predicted iteration: {100 * runs['eager']['time_error']:+.1f} % off eager "
             f"({'held' if runs['eager']['trust']['trusted'] else 'not trusted'}), "
             f"{100 * runs['graphed']['time_error']:+.1f} % graphed "
             f"({'held' if runs['graphed']['trust']['trusted'] else 'not trusted'})."]
    verdict = runs["graphed"].get("verdict")
    if verdict is not None:
        lines.append(f"- Graphed, the planner chose {verdict['what']}; the no-harm rule measured it "
                     f"{100 * verdict['slowdown']:+.1f} % in time and {-100 * verdict['energy_saving']:+.1f} % in "
                     f"energy against the run's 1F1B iterations and {'kept it' if verdict['kept'] else 'ran 1F1B'}.")
    return [*lines, ""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--deadline-s", type=float, default=500.0)
    r.add_argument("configs", type=Path, nargs="+")
    d = sub.add_parser("render")
    d.add_argument("raw", type=Path)
    dd = sub.add_parser("render-dropin")
    dd.add_argument("raw", type=Path, nargs="+")
    c = sub.add_parser("check")
    c.add_argument("out", type=Path)
    args = p.parse_args()
    if args.command == "run":
        run(args)
    elif args.command == "check":
        check(args.out)
    elif args.command == "render-dropin":
        sys.stdout.write(render_dropin(args.raw))
    else:
        sys.stdout.write(render([args.raw]))


if __name__ == "__main__":
    main()

"""Accuracy of `envpipe search` on one GPU (P = 1, D = 1, every micro-batch size that fits): its predicted
iteration time and peak device memory against training runs, on declared models.

    python benchmarks/search_accuracy.py --out OUT --deadline-s 560   # the latest declaration's sets
    python benchmarks/search_accuracy.py --shapes DECLARATION --sets heldout --engine-model ENGINE --out OUT
    DS_ACCELERATOR=cpu python benchmarks/search_accuracy.py --out OUT --tiny   # the script's CPU check

The models, global batch, micro-batch sizes and iteration counts are declared in a shapes file committed
before the runs (``--shapes``; default: the latest, benchmarks/results/search_accuracy/call4/shapes.json).
A declaration with ``"cuda_graphs": true`` searches with `envpipe search --cuda-graphs` (on GPUs), whose found
configurations train with their units replayed as CUDA graphs; with ``"fit_step_per_parameter": true`` the fit
gives the optimizer step per parameter (benchmarks/search_fit.py).
A set with models runs: the fit set first, then its engine model is fitted (benchmarks/search_fit.py) and
written beside its runs; then the held-out set is searched with that engine model (`envpipe search
--engine-model`; without a fit set run here, ``--engine-model`` or the search's default) and trained. A
model may declare its own micro-batch sizes. Per model:

1. its layer profile (envpipe.models.gpt's layers, as examples/train_gpt.py builds them;
   envpipe.layerprof.profiler) in a child process;
2. `envpipe search --gpus-per-node 1 --global-batch G --top-k 100`: every micro-batch size whose predicted
   device peak fits the device's memory less the default margin, each with its found configuration and
   predictions (made here, before any training run of the model);
3. every found configuration trained in a child process of its own: its model (envpipe.models.gpt) and found
   configuration (envpipe.search.found), a bare EnvPipe engine running the plan's order with its units timed by CUDA
   events as the runtime does, ``warmup`` iterations then ``iterations`` timed ones (the device synchronized
   after each), or, where the declaration asks for ``min_timed_s``, as many as the predicted iteration time
   needs to fill it, up to ``max_iterations`` (short, launch-bound iterations are noisy on a shared host).
   Peak memory: the caching allocator's allocated and reserved peaks from before the model is
   built, and what the process holds outside the allocator at the end (cudaMemGetInfo; the process is alone
   on its GPU). The device peak is reserved + outside. A graphed run's recordings are made in its first
   iteration: its peaks are the larger of the warm-up's and the timed iterations' (the counters reset between),
   and it also records the timed iterations' allocated peak and the bytes of the recordings' private pools
   (``graph_pool_bytes``: memory no tensor the allocator counts as allocated owns, held all the time).
   The model is built on its GPU (a torch.device context around `envpipe.models.gpt.pipeline`), not on the CPU
   and moved: the same tensors, minutes sooner.

Children are forked from a parent that imported torch, DeepSpeed and transformers without touching CUDA
(PYTORCH_NVML_BASED_CUDA_CHECK), so that a run does not pay the imports; if a forked child cannot use CUDA,
the rest run as fresh processes. A run trains with the allocator setting its found configuration names
(PYTORCH_CUDA_ALLOC_CONF, as the printed launch command sets it). Writes OUT/<set>/<model>/{layers.json,
search.log, configs/, runs/b<b>.json}, beside each child's output host_<its name> (the host's speed while it
ran: benchmarks/host_speed.py's HostWatch in the parent), OUT/fit/{engine.json, details.json} and
ARCHIVE/search_accuracy.tar.gz, made again after every run, so that a call stopped at its time limit still
brings back what it measured. No training run starts after ``--deadline-s``. Clocks and power limits are never changed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() without a CUDA context

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "benchmarks" / "results" / "search_accuracy" / "call4" / "shapes.json"
sys.path.insert(0, str(ROOT))

from benchmarks.host_speed import HostWatch  # noqa: E402

TINY = {"family": "gpt2", "layers": 2, "hidden": 64, "heads": 2, "seq": 32, "vocab": 256}  # --tiny: the CPU check
_RUN_TIMEOUT_S = 300


# --- children: one profile or one training run each, in a process of its own -----------------------------------

def _on_gpu() -> bool:
    import torch

    return os.environ.get("DS_ACCELERATOR") != "cpu" and torch.cuda.is_available()


def _profile(spec: dict[str, Any]) -> None:
    """The layer profile of the declared model (envpipe.models.gpt, as examples/train_gpt.py --profile-layers
    builds it), with the declared repetitions."""
    import torch

    from envpipe.layerprof.profiler import Measurement, Target, profile_layers
    from envpipe.models.gpt import counting, layer_specs, lm_loss
    from envpipe.search.layers import ModelShape

    on_gpu = _on_gpu()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    torch.manual_seed(1234)
    shape = ModelShape(**spec["model"])

    def batch(b: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return next(counting(shape, b, dev))

    target = Target([layer.build for layer in layer_specs(shape)], batch, lm_loss, shape)
    how = Measurement(spec["sizes"], "bf16" if on_gpu else "fp32", reps=spec["reps"], warmup=spec["warmup"],
                      idle_seconds=spec["idle_seconds"])
    profile = profile_layers(target, how, device)
    profile.save(spec["out"])


def _train(spec: dict[str, Any]) -> None:
    """One found configuration, its model as examples/train_gpt.py builds it (envpipe.models.gpt) on a bare
    EnvPipe engine running the plan's order; its measurements to spec["out"]."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(spec["port"]))
    if spec.get("allocator"):  # read when CUDA starts in this process
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = spec["allocator"]
    import torch

    from benchmarks.gpu_memory import graph_pool_bytes, outside_allocator_bytes
    from envpipe.models.gpt import counting, pipeline
    from envpipe.plan.planfile import Plan
    from envpipe.runtime import distributed
    from envpipe.runtime.engine.engine import build
    from envpipe.runtime.entry import check_config, read_config
    from envpipe.search.found import train_settings
    from envpipe.search.layers import ModelShape

    on_gpu = _on_gpu()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    distributed.init_distributed(on_gpu)
    config = read_config(None, spec["config"])
    job, _ = train_settings(config["envpipe_search"], config)
    ds_config, cfg, found = check_config(config)
    shape = ModelShape(job["model"], job["layers"], job["hidden"], job["heads"], job["seq"], job["vocab"])
    ds_config = {**ds_config, "train_micro_batch_size_per_gpu": job["micro_batch"],
                 "gradient_accumulation_steps": job["microbatches"], "steps_per_print": 10**9}
    torch.manual_seed(1234)
    with torch.device(device):  # built on its device: the same tensors, minutes sooner
        model = pipeline(shape, 1, job["stage_layers"])
    engine = build(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), config=ds_config)
    assert cfg.plan is not None, "a found configuration carries its plan"
    engine.set_unit_orders(Plan.load(cfg.plan).orders())
    engine.time_units(True)  # CUDA events around every unit, as the runtime's iterations have them
    graphed = bool(spec.get("graphs") or cfg.cuda_graphs)  # benchmarks/graphed_runtime.py's, or the found config's
    if graphed:
        from envpipe.runtime.engine.graphs import CudaGraphs

        engine.run_units_as_graphs(CudaGraphs())
    data = counting(shape, job["micro_batch"], engine.device)
    times, units, losses = [], [], []
    warm_peaks: dict[str, int] = {}
    for i in range(spec["warmup"] + spec["iterations"]):
        if graphed and on_gpu and i == spec["warmup"]:  # recorded: the peaks from here are the steady state's
            warm_peaks = _peaks(device)
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        loss = engine.train_batch(data)
        if on_gpu:
            torch.cuda.synchronize(device)
        if i >= spec["warmup"]:
            times.append(time.perf_counter() - t0)
            units.append([[u.kind, u.mb, u.start_s, u.end_s] for u in engine.units])
        losses.append(float(loss))
    memory = None
    if on_gpu:
        stats = torch.cuda.memory_stats(device)
        steady = _peaks(device)
        peaks = {k: max(v, warm_peaks.get(k, 0)) for k, v in steady.items()}
        outside = outside_allocator_bytes(device)
        memory = {**peaks, "outside_allocator_bytes": outside,
                  "device_total_bytes": torch.cuda.mem_get_info(device)[1],
                  "device_peak_bytes": peaks["reserved_peak_bytes"] + outside,
                  "alloc_retries": stats["num_alloc_retries"], "ooms": stats["num_ooms"]}
        if graphed:  # the recordings' private pools hold memory no tensor the allocator counts owns
            memory["steady_allocated_peak_bytes"] = steady["allocated_peak_bytes"]
            memory["graph_pool_bytes"] = graph_pool_bytes()
    result = {"config": Path(spec["config"]).name, "micro_batch": job["micro_batch"],
              "microbatches": job["microbatches"],
              "allocator": spec.get("allocator") or "default",
              "predicted": found["predicted"], "predicted_label": found["label"],
              "measured": {"device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
                           "iteration_s": times, "units_per_iteration": units, "memory": memory,
                           "losses": losses, "graphs": engine.graphs.recorded if engine.graphs else None,
                           "label": "measured: wall time per iteration, the device synchronized after each; units "
                                    "by CUDA events; memory by torch.cuda's allocator counters and cudaMemGetInfo"}}
    Path(spec["out"]).write_text(json.dumps(result, indent=1) + "\n")
    distributed.exit_process()


def _peaks(device: Any) -> dict[str, int]:
    """The caching allocator's peaks since its counters were last reset."""
    import torch

    stats = torch.cuda.memory_stats(device)
    return {"allocated_peak_bytes": stats["allocated_bytes.all.peak"],
            "reserved_peak_bytes": stats["reserved_bytes.all.peak"],
            "inactive_split_peak_bytes": stats["inactive_split_bytes.all.peak"]}


def _child(spec: dict[str, Any]) -> None:
    try:
        {"profile": _profile, "train": _train}[spec["kind"]](spec)
    except BaseException:
        Path(spec["out"] + ".failed").write_text(traceback.format_exc())
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


class Children:
    """Runs children forked from this process (imports done once); falls back to fresh processes for good if a
    forked child cannot initialize CUDA."""

    def __init__(self) -> None:
        self.fork = True

    def run(self, spec: dict[str, Any], log: Path) -> bool:
        """Run one child; the host's speed meanwhile (benchmarks/host_speed.py's HostWatch) goes beside its
        output, named host_ and the output's name."""
        watch = HostWatch()
        try:
            return self._run(spec, log, watch)
        finally:
            out = Path(spec["out"])
            out.with_name(f"host_{out.name}").write_text(json.dumps(watch.to_json()) + "\n")

    def _run(self, spec: dict[str, Any], log: Path, watch: HostWatch) -> bool:
        if self.fork:
            ok = self._forked(spec, log, watch)
            failed = Path(spec["out"] + ".failed")
            if ok or not failed.exists() or "CUDA" not in failed.read_text():
                return ok
            print("  a forked child could not use CUDA: fresh processes from now on", flush=True)
            failed.unlink()
            self.fork = False
        with log.open("a") as fh, watch:
            run = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], stdout=fh,
                                 stderr=subprocess.STDOUT, timeout=_RUN_TIMEOUT_S, check=False)
        return run.returncode == 0

    @staticmethod
    def _forked(spec: dict[str, Any], log: Path, watch: HostWatch) -> bool:
        with log.open("a") as fh:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: its output to the log
                os.dup2(fh.fileno(), 1)
                os.dup2(fh.fileno(), 2)
                _child(spec)
            deadline = time.monotonic() + _RUN_TIMEOUT_S
            with watch:  # started after the fork: the child has no watcher thread
                while time.monotonic() < deadline:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        return os.waitstatus_to_exitcode(status) == 0
                    time.sleep(0.2)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return False


# --- the parent -----------------------------------------------------------------------------------------------

def search_configs(layers: Path, out: Path, global_batch: int, log: Path, engine: Path | None,
                   graphed: bool = False) -> list[Path]:
    """`envpipe search` for one GPU (``graphed``: --cuda-graphs, on a GPU's profile: the CPU check searches its
    profile without graphs): the found configurations of every micro-batch size that fits, by size."""
    cmd = [sys.executable, "-c", "import sys; from envpipe.cli import main; sys.exit(main())", "search",
           "--layers", str(layers), "--gpus-per-node", "1", "--global-batch", str(global_batch), "--top-k", "100",
           "--out-dir", str(out)]
    if engine is not None:
        cmd += ["--engine-model", str(engine)]
    if json.loads(layers.read_text())["device"] == "cpu":  # the CPU check: no device memory in the profile
        cmd += ["--memory-gib", "4", "--memory-margin-gib", "0"]
    elif graphed:
        cmd.append("--cuda-graphs")
    with log.open("w") as fh:
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=True, cwd=ROOT)
    configs = [out / "found.json", *sorted((out / "top").glob("*[0-9].json"))]
    return sorted(configs, key=lambda p: json.loads(p.read_text())["envpipe_search"]["micro_batch"])


def pack(out: Path, archive: Path) -> None:
    """Everything under ``out`` into ARCHIVE/search_accuracy.tar.gz (atomically: a stopped call keeps the last)."""
    archive.mkdir(parents=True, exist_ok=True)
    tmp = archive / ".search_accuracy.tar.gz"
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(out.iterdir()):
            tar.add(path, arcname=path.name)
    os.replace(tmp, archive / "search_accuracy.tar.gz")


class Bench:
    """One call: the sets in order, a deadline, the children, the archive."""

    def __init__(self, out: Path, archive: Path, deadline_s: float, declared: dict[str, Any]) -> None:
        self.out, self.archive, self.declared = out, archive, declared
        self.deadline = time.monotonic() + deadline_s
        self.children = Children()
        self.port = 29600

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def model(self, kind: str, entry: dict[str, Any], sizes: list[int], engine: Path | None) -> None:
        """Profile one model, search it, train every configuration that fits (of ``sizes``)."""
        name, here = entry["name"], self.out / kind / entry["name"]
        (here / "runs").mkdir(parents=True, exist_ok=True)
        print(f"{datetime.now(UTC):%H:%M:%S} {kind} {name}: profile", flush=True)
        layers = here / "layers.json"
        profile = {"kind": "profile", "model": entry["model"], "sizes": sizes, "out": str(layers),
                   **self.declared["profile"]}
        if not self.children.run(profile, here / "profile.log"):
            print(f"  profile failed: {here / 'profile.log'}", flush=True)
            return
        configs = search_configs(layers, here / "configs", self.declared["global_batch"], here / "search.log", engine,
                                 bool(self.declared.get("cuda_graphs")))
        sizes_fit = [json.loads(c.read_text())["envpipe_search"]["micro_batch"] for c in configs]
        print(f"  {len(configs)} configurations fit: micro-batch {', '.join(map(str, sizes_fit))}", flush=True)
        for config in configs:
            found = json.loads(config.read_text())["envpipe_search"]
            if self.left_s() < 30:
                print(f"  b={found['micro_batch']}: not run, the call's deadline is near", flush=True)
                continue
            self.port += 1
            stem = f"b{found['micro_batch']}"
            run = {"kind": "train", "config": str(config), "out": str(here / "runs" / f"{stem}.json"),
                   "port": self.port, "allocator": found.get("allocator", ""),
                   **timed_iterations(self.declared["iterations"], found["predicted"]["baseline_iteration_time_s"])}
            t0 = time.monotonic()
            ok = self.children.run(run, here / "runs" / f"{stem}.log")
            print(f"{datetime.now(UTC):%H:%M:%S} {kind} {name} {stem}: {'done' if ok else 'FAILED'} in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
            pack(self.out, self.archive)


def micro_batch_sizes(declared_set: dict[str, Any], entry: dict[str, Any]) -> list[int]:
    """A model's declared micro-batch sizes, else its set's, else (the tiny CPU check) every model's of the set."""
    if "micro_batch_sizes" in entry:
        return list(entry["micro_batch_sizes"])
    if "micro_batch_sizes" in declared_set:
        return list(declared_set["micro_batch_sizes"])
    return sorted({b for m in declared_set["models"] for b in m["micro_batch_sizes"]})


def timed_iterations(declared: dict[str, Any], predicted_s: float) -> dict[str, int]:
    """Warm-up and timed iterations of one run: the declared count, or more where ``min_timed_s`` asks for
    that much timed training at the predicted iteration time, at most ``max_iterations``."""
    iterations = declared["iterations"]
    if "min_timed_s" in declared:
        iterations = min(declared["max_iterations"], max(iterations, math.ceil(declared["min_timed_s"] / predicted_s)))
    return {"warmup": declared["warmup"], "iterations": iterations}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=Path, default=SHAPES, help="the declaration (default: %(default)s)")
    p.add_argument("--sets", default="fit,heldout", help="fit, heldout or both (comma-separated, in that order); "
                   "a set the declaration gives no models is left out")
    p.add_argument("--out", type=Path)
    p.add_argument("--models", help="only these models (names, comma-separated)")
    p.add_argument("--tiny", action="store_true", help="a 2-block model instead of each set's (the CPU check)")
    p.add_argument("--archive", type=Path, help="where search_accuracy.tar.gz goes (default: --out)")
    p.add_argument("--deadline-s", type=float, default=3600.0, help="start no training run after this")
    p.add_argument("--engine-model", type=Path, help="the held-out set's engine model when the fit set is not run")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(json.loads(args.child))
    if args.out is None:
        p.error("give --out")
    declared = json.loads(args.shapes.read_text())
    import deepspeed  # noqa: F401  (the heavy imports once, before any child is forked)
    import torch

    import envpipe.models.gpt  # noqa: F401  (transformers too)

    assert not torch.cuda.is_initialized(), "the parent must not hold a CUDA context before forking"
    bench = Bench(args.out, args.archive or args.out, args.deadline_s, declared)
    engine = args.engine_model
    for kind in args.sets.split(","):
        if not declared[kind].get("models"):
            print(f"{kind}: no models declared to run ({declared[kind].get('about', '')})", flush=True)
            continue
        models = [{"name": "tiny", "model": TINY}] if args.tiny else declared[kind]["models"]
        models = [m for m in models if not args.models or m["name"] in args.models.split(",")]
        for entry in models:
            if bench.left_s() < 90:
                print(f"{kind} {entry['name']}: not run, the call's deadline is near", flush=True)
                continue
            bench.model(kind, entry, micro_batch_sizes(declared[kind], entry), engine if kind == "heldout" else None)
        if kind == "fit":  # the engine model, fitted before any held-out run
            from benchmarks.search_fit import fit, load_runs

            runs = load_runs(args.out / "fit")
            if not runs:
                print("no GPU runs to fit (the CPU check): the held-out set keeps the default engine model")
                continue
            fitted, details = fit(runs, datetime.now(UTC).strftime("%Y-%m-%d"),
                                  bool(declared.get("fit_step_per_parameter")))
            engine = args.out / "fit" / "engine.json"
            engine.write_text(json.dumps(fitted.to_json(), indent=1) + "\n")
            (args.out / "fit" / "details.json").write_text(json.dumps(details, indent=1) + "\n")
            print(f"{datetime.now(UTC):%H:%M:%S} engine model: {json.dumps(fitted.to_json())}", flush=True)
        pack(bench.out, bench.archive)


if __name__ == "__main__":
    main()

"""Fit the engine model of `envpipe search` (envpipe.search.engine_model.EngineModel) on the fit set's runs of
benchmarks/search_accuracy.py: the few numbers the pipeline engine and the host add to the layer profile.

    python benchmarks/search_fit.py RUNS/fit [MORE_RUNS/fit ...] --out fit.json [--step-per-parameter]

Every folder's runs are pooled: RUNS/fit/<model>/layers.json and RUNS/fit/<model>/runs/b<b>.json
(diagnostic runs with another allocator setting, `*_expandable.json` of an earlier layout, are left out).
Time, where every run's layer profile measured the unit calls (version 3 on: the calls the engine pays once
per micro-batch and stage, the micro-batch's load; envpipe.search.timing): with the search's own code
(envpipe.search.evaluate.build_pipeline, P = 1), each run's predicted iteration time is T(k) + M h + t for
host scale k, the engine's host work h per forward unit and t per iteration (exactly linear in h and t: every
forward starts on an idle device). For every k on a grid, h and t >= 0 by least squares on the relative errors
(scipy's nnls); the k of least squared relative error wins. A host scale holds for the profiler that measured
the runs' profiles (version 4 times a block inside a chain of itself, version 3 on its own). Older profiles
have no unit calls to tell the engine's per-micro-batch work from the layers': their time terms stay 1, 0 and
0 (the label says so). The host spread (how far the host's speed wanders on the machine: the band of
envpipe.search.band), with k, h and t fitted: per run the least s in [0, 0.5] whose band, the run's predicted
time with host scale k (1 - s) and k (1 + s), holds its measured time (by bisection, the time rising with the
host scale); the largest over the runs the host's speed can explain (not the device-bound ones, by the band's
host share: their error is not the host's); 0 where time is not fitted.

With ``step_per_parameter`` (a declaration's ``"fit": {"step_per_parameter": true}``), the optimizer step is
per parameter (envpipe.search.engine_model): first t and the step per parameter by least squares on the relative
errors of every run's tail (its iteration's time outside its units: before the first, after the last) against
t + the model's parameters x the step per parameter, then k and h as above with those fixed. Runs whose units were
replayed as CUDA graphs are predicted graphed (envpipe.search.timing): the host's scale does not enter their
units, so a fit set of graphed runs only keeps k = 1 and fits h alone.

Memory, from the measurements alone: the allocator's fragmentation (its peak of
inactive split blocks, memory it can neither reuse nor give back, over its allocated peak) and the memory
outside the allocator beyond the profile's CUDA context, each the largest of the runs, so that no fit run
needed more than predicted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envpipe.search.band import DEVICE_BOUND, PROBE, host_share
from envpipe.search.cluster import Cluster
from envpipe.search.cut import Cut
from envpipe.search.engine_model import EngineModel
from envpipe.search.evaluate import build_pipeline
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import NO_UNIT_CALLS, LayerProfile, load_layer_profile
from envpipe.search.memory import MemoryTables
from envpipe.search.space import Shape

HOST_SCALES = np.round(np.arange(0.30, 1.501, 0.02), 2)
MAX_SPREAD = 0.5  # a host at half or one and a half times its fitted speed: beyond, not the host's speed


@dataclass(frozen=True)
class FitRun:
    model: str
    layers: LayerProfile
    micro_batch: int
    microbatches: int
    allocator: str
    iteration_s: float  # measured, median
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    inactive_split_peak_bytes: int
    outside_allocator_bytes: int
    device: str
    graphed: bool = False  # units replayed as CUDA graphs
    tail_s: float = 0.0  # measured, median: the iteration's time outside its units


def load_runs(fit_dir: Path) -> list[FitRun]:
    """The GPU runs under ``fit_dir`` (runs without device memory, on CPU, are not the engine's to fit)."""
    runs = []
    for model_dir in sorted(d for d in fit_dir.iterdir() if (d / "layers.json").exists()):
        layers = load_layer_profile(model_dir / "layers.json")
        for path in sorted((model_dir / "runs").glob("b*.json")):
            if not path.stem[1:].isdigit():
                continue
            run = json.loads(path.read_text())
            measured, memory = run["measured"], run["measured"]["memory"]
            if memory is None:
                continue
            runs.append(FitRun(model_dir.name, layers, run["micro_batch"], run["microbatches"],
                               run.get("allocator", "default"), statistics.median(measured["iteration_s"]),
                               memory["allocated_peak_bytes"], memory["reserved_peak_bytes"],
                               memory["inactive_split_peak_bytes"], memory["outside_allocator_bytes"],
                               measured["device"], bool(measured.get("graphs")), tail_s(measured)))
    return runs


def tail_s(measured: dict[str, Any]) -> float:
    """Median over the timed iterations of the time outside the units (units' times from the iteration's start)."""
    return statistics.median(t - (max(u[3] for u in units) - min(u[2] for u in units))
                             for t, units in zip(measured["iteration_s"], measured["units_per_iteration"], strict=True))


def predicted_iteration_s(run: FitRun, engine: EngineModel) -> float:
    """The search's 1F1B all-max iteration time of the run's configuration (P = 1, D = 1)."""
    layers, b, M = run.layers, run.micro_batch, run.microbatches
    cluster = Cluster(1, 1, 1 << 40, 1e11, 1e10, 1e-5, 1e11)
    pipeline = build_pipeline(SearchInputs.of(layers, cluster, engine, run.graphed), Shape(1, 1, b, M),
                              Cut((layers.num_layers,), 0.0), MemoryTables(layers, b, 1, M, run.graphed))
    return pipeline.baseline_time_s


def fit_step(runs: list[FitRun]) -> tuple[float, float]:
    """The engine's work per iteration t and the optimizer step per parameter (see the docstring)."""
    tails = np.array([r.tail_s for r in runs])
    parameters = np.array([sum(layer.parameters for layer in r.layers.layers) for r in runs], float)
    (t, per_parameter), _ = nnls(np.c_[1.0 / tails, parameters / tails], np.ones(len(runs)))
    return float(t), float(per_parameter)


def fit_time(runs: list[FitRun], allocator: str, step: tuple[float, float] | None = None
             ) -> tuple[float, float, float]:
    """The host scale k, the engine's host work per forward unit h and per iteration t (see the docstring); with
    ``step`` (t, the step per parameter: fit_step) only k and h."""
    measured = np.array([r.iteration_s for r in runs])
    per_unit = np.array([r.microbatches for r in runs], float)
    best: tuple[float, float, float, float] | None = None
    scales = [1.0] if all(r.graphed for r in runs) else HOST_SCALES
    for k in scales:
        base = EngineModel(0.0, 0.0, float(k), 0.0, 0, allocator, "fit")
        if step is not None:
            base = replace(base, iteration_s=step[0], step_per_parameter_s=step[1])
        core = np.array([predicted_iteration_s(r, base) for r in runs])
        # relative error (core + M h [+ t] - measured) / measured, least squares with h, t >= 0 (t in core with step)
        columns = [per_unit] if step is not None else [per_unit, np.ones(len(runs))]
        solved, _ = nnls(np.c_[tuple(c / measured for c in columns)], 1.0 - core / measured)
        fitted = core + sum(x * c for x, c in zip(solved, columns, strict=True))
        error = float(np.sum((fitted - measured) ** 2 / measured**2))
        if best is None or error < best[0]:
            best = (error, float(k), float(solved[0]), step[0] if step is not None else float(solved[1]))
    assert best is not None
    return best[1], best[2], best[3]


def spread_needed(run: FitRun, engine: EngineModel) -> float | None:
    """The least host spread whose band holds the run's measured time (to 1e-4); None for a device-bound run (its
    host share below envpipe.search.band.DEVICE_BOUND: its error is not the host's) or one no spread up to
    MAX_SPREAD holds (see the docstring)."""
    def at(factor: float) -> float:
        return predicted_iteration_s(run, replace(engine, host_scale=engine.host_scale * factor))

    def holds(spread: float) -> bool:
        return at(1 - spread) <= run.iteration_s <= at(1 + spread)

    if host_share(at(1 - PROBE), at(1 + PROBE), at(1.0), PROBE) < DEVICE_BOUND or not holds(MAX_SPREAD):
        return None
    low, high = 0.0, MAX_SPREAD
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (low, mid) if holds(mid) else (mid, high)
    return high


def fit(runs: list[FitRun], date: str, step_per_parameter: bool = False) -> tuple[EngineModel, dict[str, Any]]:
    allocators = {r.allocator for r in runs}
    if len(allocators) != 1:
        raise SystemExit(f"the fit runs used several allocator settings: {sorted(allocators)}")
    allocator = allocators.pop()
    timed = all(r.layers.unit_calls != NO_UNIT_CALLS for r in runs)
    step = fit_step(runs) if step_per_parameter and timed else None
    k, h, t = fit_time(runs, allocator, step) if timed else (1.0, 0.0, 0.0)
    fragmentation = max(r.inactive_split_peak_bytes / r.allocated_peak_bytes for r in runs)
    outside = max(r.outside_allocator_bytes - r.layers.device_memory.outside_allocator_bytes for r in runs)
    models = sorted({r.model for r in runs})
    label = (f"fitted {date} by benchmarks/search_fit.py on {len(runs)} runs of {', '.join(models)} "
             f"({runs[0].device}, allocator {allocator or 'default'})")
    if not timed:
        label += (": memory; time not fitted (the runs' layer profiles, version 2, have no unit calls): host scale "
                  "1, no engine host work")
    engine = EngineModel(round(h, 7), round(t, 6), k, round(fragmentation, 4), int(outside), allocator, label,
                         step_per_parameter_s=None if step is None else float(f"{step[1]:.4g}"))
    needed = [spread_needed(r, engine) if timed else None for r in runs]
    engine = replace(engine, host_spread=round(max((n for n in needed if n is not None), default=0.0), 3))
    residuals = [{"model": r.model, "micro_batch": r.micro_batch, "microbatches": r.microbatches,
                  "measured_s": r.iteration_s, "predicted_s": predicted_iteration_s(r, engine),
                  "reserved_over_allocated": r.reserved_peak_bytes / r.allocated_peak_bytes - 1,
                  "inactive_split_over_allocated": r.inactive_split_peak_bytes / r.allocated_peak_bytes,
                  "outside_beyond_profile_bytes": r.outside_allocator_bytes
                  - r.layers.device_memory.outside_allocator_bytes, "host_spread_needed": n,
                  "graphed": r.graphed, "tail_s": r.tail_s}
                 for r, n in zip(runs, needed, strict=True)]
    return engine, {"engine_model": engine.to_json(), "runs": residuals}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("fit_dirs", type=Path, nargs="+", metavar="fit_dir", help="a fit set's folder; several pool")
    p.add_argument("--out", type=Path, required=True, help="the engine model JSON (`envpipe search --engine-model`)")
    p.add_argument("--details", type=Path, help="also the fit's per-run residuals, JSON")
    p.add_argument("--date", default=None, help="the date in the label (default: the layer profiles')")
    p.add_argument("--step-per-parameter", action="store_true", help="fit the optimizer step per parameter")
    args = p.parse_args()
    missing = [str(folder) for folder in args.fit_dirs if not folder.is_dir()]
    if missing:
        raise SystemExit(f"not a folder: {', '.join(missing)}")
    runs = [run for folder in args.fit_dirs for run in load_runs(folder)]
    if not runs:
        raise SystemExit(f"no GPU runs under {', '.join(map(str, args.fit_dirs))}")
    date = args.date or min(r.layers.date for r in runs)[:10]
    engine, details = fit(runs, date, args.step_per_parameter)
    args.out.write_text(json.dumps(engine.to_json(), indent=1) + "\n")
    if args.details:
        args.details.write_text(json.dumps(details, indent=1) + "\n")
    print(json.dumps(engine.to_json(), indent=1))


if __name__ == "__main__":
    main()

"""The study's per-unit view: the search's forward and backward unit and optimizer steps (envpipe.search.timing)
against the units the runtime timed, and each run's regime by its profile's host and device time."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.search_study.common import MS, load_json
from envpipe.search.engine_model import load_engine_model
from envpipe.search.layers import load_layer_profile
from envpipe.search.timing import unit_times

LAUNCH_BOUND = 1.25  # a profile's summed host time over its device time above this: launch-bound (below 1/it: device)


def decile(values: list[float], k: int) -> float:
    """The k-th decile (1..9) of ``values``."""
    return statistics.quantiles(values, n=10)[k - 1]


def units(call: Path, runs: tuple[str, ...], engine_path: Path | None = None) -> list[dict[str, Any]]:
    """Per run: the search's forward and backward unit and its optimizer steps against the measured units (CUDA
    events) and the measured tail (the iteration's wall time after its last unit)."""
    engine = load_engine_model(engine_path or call / "engine.json")
    out = []
    for run in runs:
        for model in sorted((call / run / "heldout").iterdir()):
            profile = load_layer_profile(model / "layers.json")
            calls = profile.unit_calls
            for path in sorted((model / "runs").glob("b*.json"), key=lambda p: int(p.stem[1:])):
                measured = load_json(path)["measured"]
                b = load_json(path)["micro_batch"]
                forward, backward = unit_times([layer.per_micro_batch[b] for layer in profile.layers], engine,
                                               calls.backward_s, calls.load(b))
                spans = [u for it in measured["units_per_iteration"] for u in it]
                costs = [layer.per_micro_batch[b] for layer in profile.layers]
                host = sum(c.forward_host_s + c.backward_host_s for c in costs)
                device = sum(c.forward_s + c.backward_s for c in costs)
                row: dict[str, Any] = {"model": model.name, "b": b, "F_pred": forward, "B_pred": backward,
                                       "steps": sum(layer.optimizer_step_s for layer in profile.layers),
                                       "layers": profile.num_layers, "regime": regime(host / device),
                                       "forward_host": sum(c.forward_host_s for c in costs),
                                       "tail": statistics.median(wall - it[-1][3] for it, wall in
                                                                 zip(measured["units_per_iteration"],
                                                                     measured["iteration_s"], strict=True))}
                for kind in ("F", "B"):
                    row[kind] = [end - start for k, _, start, end in spans if k == kind]
                out.append(row)
    return out


def regime(host_over_device: float) -> str:
    """A run's regime by its profile's summed host time over its summed device time."""
    if host_over_device > LAUNCH_BOUND:
        return "launch-bound"
    return "device-bound" if host_over_device < 1 / LAUNCH_BOUND else "mixed"


def unit_regimes_table(found: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | b | regime | forward unit predicted (ms) | measured median (10th-90th percentile) (ms) | "
             "error | backward unit predicted (ms) | measured median (10th-90th percentile) (ms) | error | "
             "optimizer steps predicted / tail measured (ms) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in found:
        cells = []
        for kind in ("F", "B"):
            med = statistics.median(r[kind])
            cells.append(f"{r[kind + '_pred'] * MS:.1f} | {med * MS:.1f} ({decile(r[kind], 1) * MS:.1f}-"
                         f"{decile(r[kind], 9) * MS:.1f}) | {100 * (r[kind + '_pred'] - med) / med:+.0f} %")
        lines.append(f"| {r['model']} | {r['b']} | {r['regime']} | " + " | ".join(cells)
                     + f" | {r['steps'] * MS:.1f} / {r['tail'] * MS:.1f} |")
    return lines

"""The fifth round (call6: one H200, the host band; run1 the fit set, run2 the held-out set): a fit set for this
host's engine model and host spread, two unseen models scored with the search's host band and regime, and the
chain check after the runs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.common import prediction_error
from benchmarks.search_fit import FitRun, load_runs, predicted_iteration_s
from benchmarks.search_study.common import (
    GIB,
    MEMORY_TARGET,
    MS,
    RAW,
    SHORT_LIMIT,
    TIME_TARGET,
    US,
    Row,
    declared,
    engine_line,
    load_json,
    machine_line,
    rows,
    smi_excerpt,
    span,
)
from benchmarks.search_study.per_unit import units
from envpipe.search.engine_model import EngineModel, load_engine_model
from envpipe.search.layers import load_layer_profile

CALL6 = RAW / "call6"
BAND_LIMIT = 0.08  # issue #38: a launch-bound configuration's band may be at most +-8 %
CALL6_CODE = "230d7cc"  # run2's machine.txt reads "commit 7a": a slip in the call's COMMIT variable (see render)


@dataclass(frozen=True)
class Banded:
    """A held-out run with the search's regime and band (its found configuration's, scaled to the 1F1B time)."""

    row: Row
    regime: str
    host_share: float
    band_s: tuple[float, float]
    host_us: tuple[float, float]  # the host's python workload, median window: at the profile, at the run

    @property
    def half_width(self) -> float:
        return (self.band_s[1] - self.band_s[0]) / 2 / self.row.time_pred_s

    @property
    def in_band(self) -> bool:
        return self.band_s[0] <= self.row.time_meas_s <= self.band_s[1]

    def time_met(self) -> bool:
        """Issue #38's time target: within 5 %, or, launch-bound only, a band of at most +-8 % that holds it."""
        return abs(self.row.time_err) <= TIME_TARGET or (
            self.regime == "launch-bound" and self.half_width <= BAND_LIMIT + 1e-9 and self.in_band)

    def memory_met(self) -> bool:
        return abs(self.row.need_err) <= MEMORY_TARGET and self.row.need_err >= SHORT_LIMIT


def banded(run: Path) -> list[Banded]:
    out = []
    for r in rows(run, "heldout", load_json(CALL6 / "engine.json")):
        model = run / "heldout" / r.model
        predicted = load_json(model / "runs" / f"b{r.b}.json")["predicted"]
        low, high = (t / predicted["iteration_time_s"] * r.time_pred_s for t in predicted["time_band_s"])
        speed = tuple(statistics.median(load_json(path)["window_medians_s"]) * US
                      for path in (model / "host_layers.json", model / "runs" / f"host_b{r.b}.json"))
        out.append(Banded(r, predicted["regime"], predicted["host_share"], (low, high), (speed[0], speed[1])))
    return out


def banded_table(found: list[Banded]) -> list[str]:
    lines = ["| model | b | M | regime (host share) | iteration predicted (ms) | host band (ms) | measured median "
             "(min-max) (ms) | error | in band | time target | device need predicted / measured (GiB) | error | "
             "host at profile / run (us) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in found:
        r = f.row
        lines.append(
            f"| {r.model} | {r.b} | {r.M} | {f.regime} ({f.host_share:.2f}) | {r.time_pred_s * MS:.1f} | "
            f"{f.band_s[0] * MS:.1f}-{f.band_s[1] * MS:.1f} (+-{100 * f.half_width:.1f} %) | {r.time_meas_s * MS:.1f} "
            f"({min(r.times_s) * MS:.0f}-{max(r.times_s) * MS:.0f}) | {100 * r.time_err:+.1f} % | "
            f"{'yes' if f.in_band else 'no'} | {'met' if f.time_met() else 'missed'} | "
            f"{r.need_pred / GIB:.2f} / {r.need_meas / GIB:.2f} | {100 * r.need_err:+.1f} % | "
            f"{f.host_us[0]:.0f} / {f.host_us[1]:.0f} |")
    return lines


def call6_fit_table() -> list[str]:
    runs = sorted(load_json(CALL6 / "run1" / "fit" / "details.json")["runs"],
                  key=lambda r: (r["model"], r["micro_batch"]))
    lines = ["| model | b | measured (ms) | fitted (ms) | error | host spread its band needs |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        need = r["host_spread_needed"]
        lines.append(f"| {r['model']} | {r['micro_batch']} | {r['measured_s'] * MS:.1f} | "
                     f"{r['predicted_s'] * MS:.1f} | "
                     f"{100 * prediction_error(r['predicted_s'], r['measured_s']):+.1f} % | "
                     f"{'device-bound: not the host' if need is None else f'{100 * need:.1f} %'} |")
    return lines


def call6_units_table(run: Path) -> list[str]:
    """Per run the forward and backward unit and the optimizer steps, predicted (envpipe.search.timing with
    call6/engine.json) against measured (CUDA events; the tail: the iteration's wall time after its last unit)."""
    lines = ["| model | b | forward unit predicted / measured median (ms) | error | backward unit predicted / measured "
             "median (ms) | error | optimizer steps predicted / tail measured (ms) |", "|---|---|---|---|---|---|---|"]
    for u in units(run.parent, (run.name,), CALL6 / "engine.json"):
        f, b = statistics.median(u["F"]), statistics.median(u["B"])
        lines.append(f"| {u['model']} | {u['b']} | {u['F_pred'] * MS:.1f} / {f * MS:.1f} | "
                     f"{100 * prediction_error(u['F_pred'], f):+.0f} % | {u['B_pred'] * MS:.1f} / {b * MS:.1f} | "
                     f"{100 * prediction_error(u['B_pred'], b):+.0f} % | "
                     f"{u['steps'] * MS:.1f} / {u['tail'] * MS:.1f} |")
    return lines


def render() -> str:
    fit_run, held_run = CALL6 / "run1", CALL6 / "run2"
    found = banded(held_run)
    engine = load_json(CALL6 / "engine.json")
    engine_model, runs, ratio = load_engine_model(CALL6 / "engine.json"), _fit_runs(held_run), _fit_speed_ratio()
    scaled = _speed_scaled(held_run, found, runs, engine_model, ratio)
    scales = [_matching_scale(f, runs[(f.row.model, f.row.b)], engine_model) for f in found]
    worse = sum(abs(e) > abs(f.row.time_err) for f, e in zip(found, scaled, strict=True))
    better = sum(abs(e) < abs(f.row.time_err) for f, e in zip(found, scaled, strict=True))
    matched = [k for k in scales if k is not None]
    chain_lines, inside, total = call6_chain_table()
    time_met = [f for f in found if f.time_met()]
    launch = [f for f in found if f.regime == "launch-bound"]
    device = [f for f in found if f.regime == "device-bound"]
    command = ("`OUT=... COMMIT=... bash benchmarks/search_accuracy_gpu.sh --sets {sets} --shapes "
               "benchmarks/results/search_accuracy/call6/shapes.json{engine} --deadline-s {deadline}`")
    out = [
        "# `envpipe search` on one GPU, fifth round: the host band, on an H200",
        "",
        "Rendered by `python benchmarks/search_results.py call6` from the raw files in",
        "[search_accuracy/call6/](search_accuracy/call6/) (the declaration and the engine model, each committed before",
        "the call that used it; every run's JSON with the search's predictions, the layer profiles, the search's",
        "outputs, logs, `nvidia-smi -q`, the host's speed beside every profile and run). Earlier rounds:",
        "[search_accuracy.md](search_accuracy.md), [search_accuracy_call3.md](search_accuracy_call3.md),",
        "[search_accuracy_call4.md](search_accuracy_call4.md).",
        "",
        f"- fit set: **measured {machine_line(CALL6, 'run1')}**: "
        + command.format(sets="fit", engine="", deadline=500) + ".",
        f"- held-out set: **measured {machine_line(CALL6, 'run2')}**: "
        + command.format(sets="heldout", engine=" --engine-model benchmarks/results/search_accuracy/call6/engine.json",
                         deadline=520) + f". Its machine.txt reads `commit 7a`: the call's COMMIT variable was "
        f"mistyped; the code carried was {CALL6_CODE}, the commit that added call6/engine.json (the tree was clean).",
        "  Both calls ran on the same machine, one after the other: the second's archive also held the first's",
        "  `fit/` folder, byte for byte run1/fit, left out of run2/.",
        "",
        "**Clocks and power limits were never changed** (the GPU's clock event counters after each call):",
        "",
        "```text",
        *smi_excerpt(fit_run),
        "held-out call: " + smi_excerpt(held_run)[-1],
        "```",
        "",
        "## The declaration",
        "",
        *declared(CALL6),
        "",
        "## The fit set: this host's engine model",
        "",
        "call6/engine.json, fitted on the fit set's runs and committed before the held-out call: "
        f"{engine_line(CALL6 / 'engine.json')};",
        f"**host spread {100 * engine['host_spread']:.1f} %**. In sample (call6/run1/fit/details.json):",
        "",
        *call6_fit_table(),
        "",
        "## Held out: two models never used before, searched with call6/engine.json",
        "",
        f"- {len(found)} runs: time target (issue #38) met on {len(time_met)} of {len(found)} "
        f"(within 5 %: {sum(abs(f.row.time_err) <= TIME_TARGET for f in found)}; launch-bound runs whose band holds "
        f"the measured time: {sum(f.in_band for f in launch)} of {len(launch)}); iteration time |error| median "
        f"{100 * statistics.median(abs(f.row.time_err) for f in found):.1f} %, max "
        f"{100 * max(abs(f.row.time_err) for f in found):.1f} %.",
        f"- Memory: **{'met' if all(f.memory_met() for f in found) else 'not met'}** (device need error "
        f"{100 * min(f.row.need_err for f in found):+.1f} to {100 * max(f.row.need_err for f in found):+.1f} %).",
        f"- Time: **{'met' if len(time_met) == len(found) else 'not met'}**; missed: "
        + (", ".join(f"{f.row.model} b={f.row.b} {100 * f.row.time_err:+.1f} % ({f.regime})"
                     for f in found if not f.time_met()) or "none") + ".",
        "",
        *banded_table(found),
        "",
        "Per unit (the regime column above is the search's own, from its band: envpipe.search.band):",
        "",
        *call6_units_table(held_run),
        "",
        "## What the runs show",
        "",
        f"- Device-bound runs ({len(device)}): the units are predicted within "
        f"{_unit_span(held_run, {(f.row.model, f.row.b) for f in device})}; their iteration errors are "
        + ", ".join(f"{100 * f.row.time_err:+.1f} %" for f in device)
        + ". Where they miss, it is the tail: the optimizer steps, timed by the profile layer by layer, against",
        "  the iteration's time after its last unit (last column above).",
        "- Launch-bound runs: the host band is the fit set's spread times the run's host share, so it is as wide as",
        "  the fit set's runs needed, no wider; it holds where the held-out model's host time scales like the fit",
        "  set's. The host scale at which each run's prediction equals its measured time (the search's own time",
        "  model, bisection; the engine model's is "
        f"{engine['host_scale']:.2f}), and the prediction with its host times scaled by the run's over its",
        "  profile's host-speed reading (over the fit set's median of that ratio, "
        f"{ratio:.2f}):",
        "",
        *host_scale_table(found, scaled, scales),
        "",
        "  The host-speed readings (the python workload in the benchmark's parent process, not in the training",
        f"  child) do not explain the errors: scaling by them moves {worse} of the {len(found)} predictions further",
        f"  from the measured time and {better} closer. The host scale a launch-bound run needs differs by run"
        f" ({span(matched)}",
        "  where one exists, against the one fitted), and where none does (a '-' on a launch-bound run) the run was",
        "  faster than the search's time model allows at any host scale down to 0.3: its units ran faster than the",
        "  profile's own device and repeat times. So the misses are the per-layer times themselves on this narrow,",
        "  deep GPT-2 (and the optimizer steps' tail), not only the host's speed: a band on the host scale cannot",
        "  hold them.",
        "",
        "## After the runs: how steady the host's time is",
        "",
        f"**measured {machine_line(CALL6, 'chain')}**: `python benchmarks/layer_chain_check.py --blocks 8 --pairs 12 "
        "--shapes benchmarks/results/search_accuracy/call6/shapes.json` (the held-out models; 12 pairs one after the",
        "other in one process, about a minute), beside `python benchmarks/host_speed.py --seconds 8` (chain/). The",
        "same blocks' host time, pair after pair:",
        "",
        *chain_lines,
        "",
        "The host took up to the max / min columns' times as long for the same work within a minute, in one",
        f"process; the held-out profiles' block times lie inside the pairs' range in {inside} of {total}. A "
        "launch-bound prediction is a draw from",
        "this spread, and so is the profile's host time it starts from: on this host no band of +-8 % holds every",
        "launch-bound run unless the prediction knows the host's speed at the run (or the profile measures its",
        "own host spread and the band is read from it).",
        "",
    ]
    return "\n".join(out)


def _fit_speed_ratio() -> float:
    """The fit set's median over its runs of the host-speed reading at the run over that at its profile."""
    fit = CALL6 / "run1" / "fit"
    return statistics.median(_speed(fit / r["model"] / "runs" / f"host_b{r['micro_batch']}.json")
                             / _speed(fit / r["model"] / "host_layers.json")
                             for r in load_json(fit / "details.json")["runs"])


def _speed(path: Path) -> float:
    return statistics.median(load_json(path)["window_medians_s"])


def _fit_runs(run: Path) -> dict[tuple[str, int], FitRun]:
    return {(r.model, r.micro_batch): r for r in load_runs(run / "heldout")}


def _speed_scaled(run: Path, found: list[Banded], runs: dict[tuple[str, int], FitRun], engine: EngineModel,
                  ratio: float) -> list[float]:
    """Per run the error of its prediction with the host's times scaled by its host-speed readings over the fit
    set's ``ratio`` (see above)."""
    out = []
    for f in found:
        model = run / "heldout" / f.row.model
        scale = (_speed(model / "runs" / f"host_b{f.row.b}.json") / _speed(model / "host_layers.json")) / ratio
        fit_run = runs[(f.row.model, f.row.b)]
        scaled = predicted_iteration_s(fit_run, replace(engine, host_scale=engine.host_scale * scale))
        out.append(prediction_error(scaled, fit_run.iteration_s))
    return out


def _matching_scale(f: Banded, fit_run: FitRun, engine: EngineModel) -> float | None:
    """The host scale at which the search's time model predicts the run's measured time (None: no scale in
    [0.3, 3] does: the host does not set its time)."""

    def at(k: float) -> float:
        return predicted_iteration_s(fit_run, replace(engine, host_scale=k))

    low, high = 0.3, 3.0
    if not at(low) <= fit_run.iteration_s <= at(high) or f.regime == "device-bound":
        return None
    while high - low > 1e-3:
        mid = (low + high) / 2
        low, high = (mid, high) if at(mid) < fit_run.iteration_s else (low, mid)
    return (low + high) / 2


def host_scale_table(found: list[Banded], scaled_errors: list[float], scales: list[float | None]) -> list[str]:
    lines = ["| model | b | regime | error | host scale that predicts the measured time | error scaled by the "
             "host-speed readings |", "|---|---|---|---|---|---|"]
    for f, scaled, k in zip(found, scaled_errors, scales, strict=True):
        lines.append(f"| {f.row.model} | {f.row.b} | {f.regime} | {100 * f.row.time_err:+.1f} % | "
                     f"{'-' if k is None else f'{k:.2f}'} | {100 * scaled:+.1f} % |")
    return lines


def call6_chain_table() -> tuple[list[str], int, int]:
    """The chain check after the runs (call6/chain/chain.json): per held-out model and unit, the host's time per
    block for the same 8 blocks, over the pairs (chain: issued as the engine issues a stage; profiled: as the
    layer profiler times a block), against the block's host time in the held-out profile the search used; and how
    many of those profile times lie within the pairs' range (either method's), of how many."""
    data = load_json(CALL6 / "chain" / "chain.json")
    blocks, inside, total = data["blocks"], 0, 0
    lines = ["| model | unit | chain, per block: median (min-max) (ms) | max / min | profiled, per block: median "
             "(min-max) (ms) | max / min | the held-out profile's block, micro-batch 1 (ms) |",
             "|---|---|---|---|---|---|---|"]
    for name, found in data["models"].items():
        block = load_layer_profile(CALL6 / "run2" / "heldout" / name / "layers.json").layers[1].per_micro_batch[1]
        for unit in ("forward", "backward"):
            cells, low, high = [], float("inf"), 0.0
            for key in (f"chain_{unit}_s", f"chained_{unit}_host_s"):
                xs = [pair[key] / blocks for pair in found["pairs"]]  # both are sums over the blocks
                cells += [f"{statistics.median(xs) * MS:.2f} ({min(xs) * MS:.2f}-{max(xs) * MS:.2f})",
                          f"{max(xs) / min(xs):.2f}"]
                low, high = min(low, *xs), max(high, *xs)
            profiled = block.forward_host_s if unit == "forward" else block.backward_host_s
            inside += low <= profiled <= high
            total += 1
            lines.append(f"| {name} | {unit} | {' | '.join(cells)} | {profiled * MS:.2f} |")
    return lines, inside, total


def _unit_span(run: Path, which: set[tuple[str, int]]) -> str:
    errors = [100 * prediction_error(u[f"{k}_pred"], statistics.median(u[k]))
              for u in units(run.parent, (run.name,), CALL6 / "engine.json")
              if (u["model"], u["b"]) in which for k in ("F", "B")]
    return f"{min(errors):+.0f} to {max(errors):+.0f} %" if errors else "(none)"

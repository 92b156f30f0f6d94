"""Render benchmarks/runtime_bench.py's output folder: stock DeepSpeed against the drop-in engine (throughput and
peak memory, each engine in its own processes) and the drop-in engine's predictions against its measurements
(iteration energy per stage and in total, iteration time).

    python benchmarks/runtime_results.py dropin OUT [OUT ...] > benchmarks/results/dropin_<gpu>.md

Every number comes from the runs' own summaries (envpipe.runtime.summary.RunSummary) and OUT/machine.txt.
Errors are (predicted - measured) / measured.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import md_row, md_table, prediction_error, shown_path
from benchmarks.runtime_bench import PLAN_ENGINE, REHEARSE_ENGINE
from envpipe.runtime import summary as S
from envpipe.runtime.summary import RunSummary


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _gib(b: int | None) -> str:
    return "—" if b is None else f"{b / 2**30:.1f}"


@dataclass(frozen=True)
class Bench:
    """One output folder of benchmarks/runtime_bench.py, read once."""

    out: Path
    bench: dict
    folders: dict[tuple[str, int, str], Path]  # the runs that ended with a report, by (model, round, engine)
    summaries: dict[tuple[str, int, str], RunSummary]
    energy_void: str | None  # why the folder's energy readings are not this job's GPUs' (energy_void.txt), if so

    @classmethod
    def load(cls, out: Path) -> Bench:
        bench = json.loads((out / "bench.json").read_text())
        folders = {(r["model"], r["round"], r["engine"]): out / r["folder"] for r in bench["runs"]
                   if r["exit"] == 0 and (out / r["folder"] / "summary.json").is_file()}
        void = out / "energy_void.txt"
        return cls(out, bench, folders, {key: RunSummary.load(f / "summary.json") for key, f in folders.items()},
                   void.read_text().strip() if void.is_file() else None)

    def energy(self, s: RunSummary) -> S.EnergyPrediction | None:
        """The run's energy prediction against the counter, unless the folder's readings are void."""
        return None if self.energy_void else s.energy


def render_all(outs: list[Path]) -> str:
    """Several output folders (runs of different models or days) in one file: with more than one, a summary by
    code version first, then one section each."""
    benches = [Bench.load(out) for out in outs]
    sections = [render(b) for b in benches]
    title, rest = sections[0].split("\n", 1)
    head = [title, "", *_summary(benches)] if len(outs) > 1 else [title]
    body = "\n".join([rest.lstrip("\n"), *(x.split("\n", 2)[2] for x in sections[1:])])
    return "\n".join(head) + "\n" + body + (
        f"\nRendered by `python benchmarks/runtime_results.py dropin {' '.join(shown_path(o) for o in outs)}`.\n")


def _commit(out: Path) -> str:
    path = out / "commit.txt"
    return path.read_text().split()[0] if path.is_file() else "not recorded"


def _summary(benches: list[Bench]) -> list[str]:
    """Every folder's runs pooled by the code that ran them: throughput ratios, the energy and time errors, and the
    calibration's power against the steady iterations' (from the per-iteration lines)."""
    pooled: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for b in benches:
        summaries = b.summaries
        for (model, rnd, engine), s in summaries.items():
            acc = pooled.setdefault((_commit(b.out), _label(b.bench, model), b.bench["microbatches"]), {})
            stock = summaries.get((model, rnd, "stock"))
            if engine == "envpipe" and stock is not None and stock.clock.time == s.clock.time:
                acc.setdefault("ratio", []).append(stock.steady.time_s.median / s.steady.time_s.median)
            if engine == "stock":  # how steady the host was: the stock run's interquartile range of iteration times
                t = s.steady.time_s
                acc.setdefault("stock spread", []).append((t.q3 - t.q1) / t.median)
                continue
            kind = "1f1b" if engine == "envpipe" else "plan"
            energy = b.energy(s)
            if energy is not None:
                acc.setdefault(f"energy {kind}", []).append(energy.error)
            if s.predicted_iteration_time_s is not None:
                acc.setdefault(f"time {kind}", []).append(
                    prediction_error(s.predicted_iteration_time_s, s.steady.time_s.median))
            measured = s.calibration.iterations if s.calibration is not None and not b.energy_void else 0
            for name, values in _energy_checks(b.folders[model, rnd, engine], measured).items():
                acc.setdefault(name, []).extend(values)
            if s.calibration is not None and s.calibration.blocking_power_w is not None and not b.energy_void:
                acc.setdefault("blocking power", []).extend(s.calibration.blocking_power_w)

    def cell(xs: list[float] | None, pct: bool = True, watts: bool = False) -> str:
        if not xs:
            return "—"
        show = (lambda x: f"{x:.0f}") if watts else _pct if pct else (lambda x: f"{x:.4f}")
        if len(xs) == 1:
            return show(xs[0])
        middle = f"median {show(statistics.median(xs))}, " if len(xs) > 2 else ""
        return f"{middle}{show(min(xs))} … {show(max(xs))} (n = {len(xs)})"

    lines = ["## Summary by code version", "",
             "Every folder below pooled by the commit that ran it, in the folders' order. Drop-in / stock: "
             "throughput ratio per round (target ≥ 0.995). Energy and time errors: the runtime's prediction against "
             "the NVML counter and the wall clock over the steady iterations, per run (target within 3 %): `1f1b` "
             "runs held to DeepSpeed's order, `plan` runs the default policy's order with clocks untouched. "
             "Calibration power: per run and stage, the mean power of the calibration's measured iterations over "
             "that of the steady 1F1B iterations (iterations over 1.5 x the median time left out), from "
             "iterations.rank*.jsonl. Stock spread: each stock run's interquartile range of steady iteration "
             "times over their median (the host's noise, which the ratios share).", "",
             *md_table("code", "model", "M", "drop-in / stock", "energy error, 1f1b", "energy error, plan",
                       "time error, 1f1b", "time error, plan", "calibration power vs steady", "stock spread")]
    for (commit, model, microbatches), acc in pooled.items():  # in the folders' order
        if not any(acc.values()):
            continue  # only stock runs finished
        lines.append(md_row(commit, model, microbatches, cell(acc.get("ratio"), pct=False),
                            cell(acc.get("energy 1f1b")), cell(acc.get("energy plan")), cell(acc.get("time 1f1b")),
                            cell(acc.get("time plan")), cell(acc.get("calibration power")),
                            cell(acc.get("stock spread"))))
    lines += ["", "The calibration's energy, per run and stage (same pooling): the blocking power the model charges "
              "waits at (W; measured blocked in a collective from 13c24cb on, before it from the interpolated counter "
              "over the iterations' waits); the marginal power of the steady 1F1B iterations (W: the slope of their "
              "energy against their time; an iteration the host stretched costs this much per extra second); the "
              "first measured calibration iteration's energy and the later ones' mean against the steady median.", "",
              *md_table("code", "model", "M", "blocking power (W)", "marginal power (W)",
                        "first measured calibration iteration vs steady", "later ones vs steady")]
    for (commit, model, microbatches), acc in pooled.items():
        if acc.get("first measured"):
            lines.append(md_row(commit, model, microbatches, cell(acc.get("blocking power"), watts=True),
                                cell(acc.get("marginal power"), watts=True), cell(acc.get("first measured")),
                                cell(acc.get("later measured"))))
    return [*lines, ""]


def _energy_checks(run: Path, measured: int) -> dict[str, list[float]]:
    """Per stage (rank), from the iteration lines, against the steady 1F1B iterations (the first and those over
    1.5 x the median time left out): the calibration's ``measured`` (last) iterations' mean power - 1 (`calibration
    power`); the first measured one's energy and the others' mean energy over the steady median - 1 (`first
    measured`, `later measured`); and the slope of energy against time over the steady iterations (`marginal
    power`, W: what an iteration stretched by the host costs per extra second; where their times span 20 ms)."""
    checks: dict[str, list[float]] = {}
    for path in sorted(run.glob("iterations.rank*.jsonl")):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        calibration = [x for x in lines if x["phase"] == "calibrate"][-measured:] if measured else []
        steady = [x for x in lines if x["phase"] == "steady" and x["runs"] == "baseline"][1:]
        if not calibration or not steady or any(x["energy_j"] is None for x in calibration + steady):
            continue
        typical = statistics.median(x["time_s"] for x in steady)
        steady = [x for x in steady if x["time_s"] < 1.5 * typical]

        def power(xs: list[dict]) -> float:
            return sum(x["energy_j"] for x in xs) / sum(x["time_s"] for x in xs)

        energy = statistics.median(x["energy_j"] for x in steady)
        checks.setdefault("calibration power", []).append(power(calibration) / power(steady) - 1)
        checks.setdefault("first measured", []).append(calibration[0]["energy_j"] / energy - 1)
        if len(calibration) > 1:
            later = statistics.mean(x["energy_j"] for x in calibration[1:])
            checks.setdefault("later measured", []).append(later / energy - 1)
        times = [x["time_s"] for x in steady]
        if max(times) - min(times) >= 0.02:
            slope = statistics.linear_regression(times, [x["energy_j"] for x in steady]).slope
            checks.setdefault("marginal power", []).append(slope)
    return checks


def render(b: Bench) -> str:
    out, bench, summaries = b.out, b.bench, b.summaries
    machine = (out / "machine.txt").read_text().strip().splitlines() if (out / "machine.txt").is_file() else []
    commit = (out / "commit.txt").read_text().strip() if (out / "commit.txt").is_file() else "not recorded"
    failed = [r for r in bench["runs"] if (r["model"], r["round"], r["engine"]) not in b.folders]
    lines = ["# Stock DeepSpeed against the drop-in engine, and the energy model against the counter", "",
             f"Raw data: `{shown_path(out)}` (bench.json, each run's summary.json, iterations.rank*.jsonl and log). "
             f"Command: `{bench['command']}`. Code: {commit}. Machine:", "", *(f"    {x}" for x in machine), "",
             f"Each engine ran examples/train_gpt.py{_cnn(bench)} in processes of its own "
             f"({bench['gpus']} per job, {_layout(bench)}, M = {bench['microbatches']}), alternating by round. Clocks "
             "were never changed: the "
             "drop-in engine ran without envpipe-clockd (clock 'auto': default clocks, the NVML energy counter), so "
             "its steady iterations are 1F1B at default clocks. Peak memory: each job's own allocator peak on GPU 0 "
             "(from before the model was built). Times and energies are measured; predictions are the runtime's "
             "(simulated); error = (predicted − measured) / measured.", ""]
    if bench.get("pair_scheduling"):
        lines[-1:-1] = [f"The drop-in engine of each pair was held to DeepSpeed's order (ENVPIPE_SCHEDULING="
                        f"{bench['pair_scheduling']}); `{PLAN_ENGINE}` runs are the engine as a user gets it (its "
                        "default policy, whose order ran with clocks untouched, interleaved with 1F1B iterations)."]
    if b.energy_void:
        lines += [f"**Energy void in this folder:** {b.energy_void} Its energy numbers are left out (—); its times "
                  "are measured and shown.", ""]
    lines += ["## Throughput and memory", "",
              *md_table("model", "round", "stock iteration (ms)", "drop-in iteration (ms)", "drop-in / stock",
                        "stock peak (GiB)", "drop-in peak (GiB)")]
    ratios: dict[str, list[float]] = {}
    for model, rnd in sorted({(m, r) for m, r, _ in summaries}):
        stock, ours = summaries.get((model, rnd, "stock")), summaries.get((model, rnd, "envpipe"))
        if stock is None or ours is None:
            continue
        same_kind = stock.clock.time == ours.clock.time  # a ratio only between two numbers of one kind
        ratio = stock.steady.time_s.median / ours.steady.time_s.median  # throughput ratio, same samples
        if same_kind:
            ratios.setdefault(model, []).append(ratio)
        lines.append(md_row(model, rnd, f"{1e3 * stock.steady.time_s.median:.1f} ({stock.clock.time})",
                            f"{1e3 * ours.steady.time_s.median:.1f} ({ours.clock.time})",
                            f"{ratio:.4f}" if same_kind else "— (times of two kinds)",
                            _gib(stock.gpus[0].peak_memory_bytes), _gib(ours.gpus[0].peak_memory_bytes)))
    lines.append("")
    for model, rs in ratios.items():
        lines.append(f"- {model}: drop-in / stock throughput {statistics.median(rs):.4f} (median of {len(rs)} "
                     f"round(s), {min(rs):.4f}–{max(rs):.4f}).")
    lines += ["", "## Predictions against measurements (drop-in engine)", "",
              *md_table("model", "round", "energy predicted / measured (J)", "error", "per stage",
                        "time predicted / measured (ms)", "error")]
    for (model, rnd, engine), s in sorted(summaries.items()):
        if engine != "envpipe":
            continue
        e, measured = b.energy(s), s.steady.time_s.median
        predicted = s.predicted_iteration_time_s
        lines.append(md_row(
            model, rnd, "—" if e is None else f"{e.predicted_j:.1f} / {e.measured_j:.1f}",
            "—" if e is None else _pct(e.error),
            "—" if e is None else ", ".join(f"{x.stage}: {_pct(x.error)}" for x in e.stages),
            "—" if predicted is None else f"{1e3 * predicted:.1f} / {1e3 * measured:.1f}",
            "—" if predicted is None else _pct(prediction_error(predicted, measured))))
    lines += _plan_runs(b, {k: v for k, v in summaries.items() if k[2] == PLAN_ENGINE})
    lines += _rehearsed(b, {k: v for k, v in summaries.items() if k[2] == REHEARSE_ENGINE})
    if failed:
        lines += ["", "Runs that failed or ended before a report (see their log.txt): " + ", ".join(
            f"{r['model']} round {r['round']} {r['engine']}" for r in failed)]
    recorded = {r["folder"] for r in bench["runs"]}
    cut = sorted(str(d.relative_to(out)) for d in out.glob("*/round*-*") if str(d.relative_to(out)) not in recorded)
    if cut:
        lines += ["", "Runs cut before the benchmark recorded them (the call's time limit; see their log.txt), left "
                  "out of the tables: " + ", ".join(cut)]
    return "\n".join(lines) + "\n"


def _plan_runs(b: Bench, summaries: dict[tuple[str, int, str], RunSummary]) -> list[str]:
    """The default policy's plan as it ran (on GPUs without envpipe-clockd its order, clocks untouched): its time,
    energy and peak memory per stage against the runtime's predictions, and against the run's own interleaved
    1F1B iterations (both sides of one kind, named in the cells)."""
    if not summaries:
        return []
    lines = ["", "## The default policy's plan deployed (its order; its clocks only where they can be set)", "",
             "Predicted peak memory of a stage (the runtime's, `MemoryUse.predicted_peak_bytes`): its static bytes "
             "(parameters, gradients, optimizer state), plus the order's most in-flight micro-batches times the "
             "activation bytes of one, plus the calibration's transient bytes (its allocator peak beyond those), all "
             "measured in calibration under 1F1B; — where the run's code did not record the transient.",
             "", *md_table("model", "run", "order that ran", "clocks", "time predicted / measured (ms)", "error",
                           "vs its interleaved 1F1B iterations: slowdown, energy saving",
                           "energy predicted / measured (J)", "error", "per stage",
                           "peak memory per stage predicted / measured (GiB)")]
    for (model, rnd, _), s in sorted(summaries.items()):
        plan, e, m = s.plan, b.energy(s), s.measured
        measured, predicted = s.steady.time_s.median, s.predicted_iteration_time_s
        order = "—" if plan is None else plan.order + ("" if plan.order_deployed else " (not deployed: 1F1B ran)")
        saving = None if m is None or m.energy_saving is None or b.energy_void else m.energy_saving.median
        vs = "—" if m is None else f"{_pct(m.slowdown.median)} ({s.clock.time}), {_pct(saving)} ({m.energy})"
        clocks = "planned" if plan is not None and plan.deployed else "untouched (default)"
        lines.append(md_row(
            model, rnd, order, clocks,
            "—" if predicted is None else f"{1e3 * predicted:.1f} / {1e3 * measured:.1f} ({s.clock.time})",
            "—" if predicted is None else _pct(prediction_error(predicted, measured)), vs,
            "—" if e is None else f"{e.predicted_j:.1f} / {e.measured_j:.1f}", "—" if e is None else _pct(e.error),
            "—" if e is None else ", ".join(f"{x.stage}: {_pct(x.error)}" for x in e.stages), _memory(s)))
    return lines


def _cnn(bench: dict) -> str:
    """How the CNN runs ran, where the folder has some."""
    return " (`cnn`: examples/train_cnn.py)" if any(r["model"].startswith("cnn") for r in bench["runs"]) else ""


def _label(bench: dict, model: str) -> str:
    """The model as the summary pools it: with its data-parallel layout where the folder ran one."""
    stages = bench.get("pipeline_stages")
    if stages is None:
        return model
    zero = f", ZeRO-{bench['zero_stage']}" if bench.get("zero_stage") else ""
    return f"{model} (DP{bench['gpus'] // stages} x PP{stages}{zero})"


def _layout(bench: dict) -> str:
    """How the job's processes are laid out: one stage each, or stages x data-parallel replicas (ZeRO)."""
    stages = bench.get("pipeline_stages")
    zero = f", ZeRO-{bench['zero_stage']}" if bench.get("zero_stage") else ""
    if stages is None:
        return f"one pipeline stage each{zero}"
    return f"{stages} pipeline stage(s) x {bench['gpus'] // stages} data-parallel replicas{zero}"


def _rehearsed(b: Bench, summaries: dict[tuple[str, int, str], RunSummary]) -> list[str]:
    """The default policy with `rehearse` (clocks untouched): the plan's units stretched by their planned clocks'
    extra time against the run's interleaved 1F1B iterations (measured) beside the planner's slowdown (simulated);
    then the plan's order against 1F1B and what the no-harm rule kept; the predictions of what ran, and whether the
    run trusted them."""
    if not summaries:
        return []
    lines = ["", "## The plan rehearsed, and what the no-harm rule kept (clocks untouched)", "",
             "Rehearsal: every unit the plan runs below the top clock stretched on the GPU by its planned clock's "
             "extra time (a kernel spinning on the GPU's timer), in ABBA pairs with 1F1B all-max iterations: the "
             "rehearsed plan's measured slowdown (median of the pairs) against the planner's predicted slowdown, "
             "and its error in points (predicted − measured). Stretch per iteration: planned (the frequency model)"
             " / inserted (the GPU's timer), per stage. The plan's energy saving is the planner's prediction only "
             "(a spinning GPU draws idle power). No harm: the plan's order at default clocks against 1F1B, and "
             "what ran after the pairs. Predictions: what ran, anchored on the calibration's untimed 1F1B "
             "iterations. Re-planned (from 2026-11-28 12:15 on): the rehearsed reconfiguration rounds before the "
             "rehearsal (each: the plan's median iteration, its measured slowdown where recorded) and why they "
             "stopped.", "",
             *md_table("model", "run", "order", "re-planned (rehearsed rounds)",
                       "rehearsed slowdown: measured / predicted", "error (points)",
                       "stretch per stage (ms): planned / inserted", "order vs 1F1B: time, energy", "kept",
                       "time error", "energy error", "per stage", "predictions trusted")]
    for (model, rnd, _), s in sorted(summaries.items()):
        r, v, e = s.rehearsal, s.verdict, b.energy(s)
        rehearsed = "—" if r is None else f"{_pct(r.slowdown.median)} / {_pct(r.predicted_slowdown)}"
        stretch = "—" if r is None else ", ".join(
            f"{x.stage}: {1e3 * x.planned_s:.2f} / " + ("—" if x.inserted_s is None else f"{1e3 * x.inserted_s:.2f}")
            for x in r.stages)
        order = "—" if v is None else f"{_pct(v.slowdown)}, " + ("—" if v.energy_saving is None or b.energy_void
                                                                 else _pct(-v.energy_saving))
        kept = "— (1F1B: nothing to compare)" if v is None else ("the order" if v.kept else "1F1B")
        time_error = None if s.predicted_iteration_time_s is None else \
            prediction_error(s.predicted_iteration_time_s, s.steady.time_s.median)
        trusted = "—" if s.trust is None else ("yes" if s.trust.trusted else "no: " + "; ".join(s.trust.reasons))
        lines.append(md_row(
            model, rnd, "—" if s.plan is None else s.plan.order, _rehearsed_rounds(s), rehearsed,
            "—" if r is None else f"{100 * r.error:+.1f}", stretch, order, kept, _pct(time_error),
            "—" if e is None else _pct(e.error), "—" if e is None else ", ".join(f"{x.stage}: {_pct(x.error)}"
                                                                                for x in e.stages), trusted))
    return lines


def _rehearsed_rounds(s: RunSummary) -> str:
    """The rehearsed reconfiguration rounds: each one's median plan iteration (ms) and measured slowdown where the
    run recorded it, then why they stopped; "—" where the run rehearsed without them."""
    r = s.reconfiguration
    if r is None or not r.rehearsed:
        return "—"
    rounds = ", ".join(f"{1e3 * x.measured_time_s:.1f} ms" + ("" if x.slowdown is None else f" ({_pct(x.slowdown)})")
                       for x in r.rounds)
    return f"{len(r.rounds)}: {rounds}; {r.stop_reason}"


def _memory(s: RunSummary) -> str:
    """Per stage: predicted / measured peak (GiB) and the error; replica 0's GPUs."""
    if s.plan is None or s.plan.memory is None:
        return "—"
    cells = []
    for g in (g for g in s.gpus if g.replica == 0):
        predicted, measured = s.plan.memory[g.stage].predicted_peak_bytes, g.peak_memory_bytes
        cells.append(f"{g.stage}: {_gib(predicted)} / {_gib(measured)}" + (
            f" ({_pct(prediction_error(predicted, measured))})" if predicted is not None and measured else ""))
    return ", ".join(cells)

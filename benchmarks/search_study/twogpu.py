"""The 2-GPU search runs' accuracy table: predicted (simulated) against measured iteration time and peak memory
per stage, from benchmarks/search_run.py's JSON files (OUT/<model>/runs/*.json).

OUT is benchmarks/search_h200.sh's work directory or its search_runs.tar.gz (machine.txt, links.json, one folder
per model with layers.json and runs/). The command that produced an OUT: the caller's, else its command.txt (for
X.tar.gz: X.command.txt beside it). Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import command_of, md_row, md_table, prediction_error, shown_path
from benchmarks.search_comms import COMMUNICATORS
from benchmarks.search_configs import cluster_from
from envpipe.plan.planfile import Plan
from envpipe.search.cut import Cut
from envpipe.search.evaluate import build_pipeline, order_time_s
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import load_layer_profile
from envpipe.search.memory import MemoryTables
from envpipe.search.space import Shape

MIB = 1 << 20
TIME_TARGET, MEMORY_TARGET = 0.05, 0.10  # the targets: time within 5 %, peak memory within 10 %
UNDER_TARGET = 0.03  # a device need predicted under by more than this would not fit (issue #38)


@dataclass(frozen=True)
class Scored:
    """One run's errors: iteration time (against the median) and the worst stage's peak memory, and whether
    that memory meets its target (the device need: never under by more than UNDER_TARGET besides)."""

    micro_batch: int
    time: float
    memory: float
    memory_ok: bool
    energy: float | None  # where the run measured its energy and the search predicted what ran


def _memory(pred: dict, meas: dict) -> tuple[list[int], list[int], bool]:
    """Predicted and measured peak memory per stage, and whether it is the device need (what must fit: runs
    since 2026-11-29 measure it) or the allocator's peak (runs before; predicted alike where the prediction
    has it)."""
    if "device_need_bytes_per_stage" in meas:
        return pred["peak_memory_bytes_per_stage"], meas["device_need_bytes_per_stage"], True
    return (pred.get("peak_allocated_bytes_per_stage", pred["peak_memory_bytes_per_stage"]),
            meas["peak_memory_bytes_per_stage"], False)


def _mib(per_stage: list[int]) -> str:
    return " / ".join(f"{b / MIB:.0f}" for b in per_stage)


@contextlib.contextmanager
def opened(raw: Path) -> Iterator[Path]:
    """A raw OUT as a directory: itself, or its .tar.gz unpacked into a temporary one."""
    if raw.is_dir():
        yield raw
        return
    if not tarfile.is_tarfile(raw):
        raise ValueError(f"{raw}: neither a directory nor a tar archive")
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(raw) as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp)


def model_section(model_dir: Path) -> tuple[list[str], list[Scored]]:
    profile = json.loads((model_dir / "layers.json").read_text())
    m = profile["model"]
    lines = [f"### {model_dir.name}: {m['family']} {m['layers']} blocks, hidden {m['hidden']}, {m['heads']} heads, "
             f"seq {m['seq']}, vocab {m['vocab']} ({profile['dtype']})", "",
             f"Layer profile measured on {profile['device']} at {profile['date']} (micro-batch sizes "
             f"{profile['micro_batch_sizes']}); clocks: {profile['clocks']['label']}.", "",
             *_declared(model_dir / "configs" / "declared.json"),
             *md_table("configuration", "P", "D", "b", "M", "stage layers", "order that ran",
                       "iteration predicted (ms)", "measured median (ms)", "error", "measured least (ms)",
                       "error vs least", "peak memory per stage predicted (MiB)", "measured (MiB)", "worst error",
                       "memory measured", "energy per iteration predicted (J)", "measured median (J)", "error")]
    scored = []
    for path in sorted((model_dir / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        s, pred, meas = run["shape"], run["predicted"], run["measured"]
        # the prediction of what ran: the plan, or (clocks not under control) its order or 1F1B at the top clock
        if meas["ran"] == "order":
            predicted_s = pred.get("order_iteration_time_s") or _order_time_s(model_dir, path.stem, s)
            order = f"{pred['order']} at default clocks" + ("" if "order_iteration_time_s" in pred else " *")
        else:
            predicted_s = pred["iteration_time_s"] if meas["ran"] == "plan" else pred["baseline_iteration_time_s"]
            order = pred["order"] if meas["ran"] == "plan" else "1f1b (baseline ran)"
        if meas.get("cuda_graphs"):
            order += ", graphed"
        t_err = prediction_error(predicted_s, meas["iteration_time_s"])
        least_err = prediction_error(predicted_s, meas["iteration_time_least_s"])
        pred_peaks, meas_peaks, need = _memory(pred, meas)
        m_errs = [prediction_error(p, m) for m, p in zip(meas_peaks, pred_peaks, strict=True)]
        worst = max(m_errs, key=abs)
        ok = abs(worst) <= MEMORY_TARGET and (not need or min(m_errs) >= -UNDER_TARGET)
        energy = _energy(model_dir / f"report_{path.stem}" / "summary.json", meas["ran"], pred)
        e_err = None if energy is None else prediction_error(*energy)
        scored.append(Scored(s["micro_batch"], t_err, worst, ok, e_err))
        lines.append(md_row(
            path.stem, s["stages"], s["replicas"], s["micro_batch"], s["microbatches"],
            ",".join(map(str, s["stage_layers"])), order, f"{predicted_s * 1e3:.1f}",
            f"{meas['iteration_time_s'] * 1e3:.1f}", f"{100 * t_err:+.1f}%",
            f"{meas['iteration_time_least_s'] * 1e3:.1f}", f"{100 * least_err:+.1f}%",
            _mib(pred_peaks), _mib(meas_peaks), f"{100 * worst:+.1f}%",
            "device need" if need else "allocator's peak",
            *(("-", "-", "-") if energy is None or e_err is None else
              (f"{energy[0]:.1f}", f"{energy[1]:.1f}", f"{100 * e_err:+.1f}%"))))
    for failed in sorted((model_dir / "runs").glob("*.failed")):
        lines.append(md_row(failed.stem, f"failed: {failed.read_text().strip()}"))
    return lines, scored


def _energy(summary_path: Path, ran: str, pred: dict) -> tuple[float, float] | None:
    """Predicted and measured energy per iteration of the job, where both are of what ran: the run's steady
    iterations measured (the runtime's report; not a simulated GPU's) and the search's prediction of that order at
    those clocks (1F1B at the top clock, or the plan with its clocks; the plan's order at default clocks has
    none)."""
    if not summary_path.exists() or ran == "order":
        return None
    summary = json.loads(summary_path.read_text())
    measured = (summary["steady"] or {}).get("energy_j")
    if measured is None or not summary["clock"]["energy"].startswith("measured"):
        return None
    return pred["energy_per_iteration_j" if ran == "plan" else "baseline_energy_per_iteration_j"], measured["median"]


def _declared(path: Path) -> list[str]:
    """What benchmarks/search_configs.py wrote when it made the predictions, before any run (runs since
    2026-11-29)."""
    if not path.exists():
        return []
    d = json.loads(path.read_text())
    return [f"Predictions written at {d['at']} (before the runs), {'graphed' if d['cuda_graphs'] else 'eager'} "
            f"(`--cuda-graphs`: {str(d['cuda_graphs']).lower()}), engine model: {d['engine_model']}.", ""]


def _order_time_s(model_dir: Path, name: str, shape: dict) -> float:
    """The search's prediction of a plan's order at the top clock, for runs made before found configurations
    carried it (`order_iteration_time_s`): the run's own layer profile, links and plan file, through the search's
    code (envpipe.search.evaluate.order_time_s); nothing measured by the run enters it."""
    layers = load_layer_profile(model_dir / "layers.json")
    P, D, b, M = shape["stages"], shape["replicas"], shape["micro_batch"], shape["microbatches"]
    cluster = cluster_from(str(model_dir.parent / "links.json"), P * D, 1.0)  # the memory does not enter the time
    pipeline = build_pipeline(SearchInputs.of(layers, cluster), Shape(P, D, b, M),
                              Cut(tuple(shape["stage_layers"]), 0.0), MemoryTables(layers, b, D, M))
    return order_time_s(pipeline, Plan.load(model_dir / "configs" / f"{name}.plan.json"))


def _communicators(links: dict[str, Any]) -> str:
    """A communicator's device memory, where benchmarks/search_comms.py measured it (since 2026-11-29)."""
    comm = links.get("communicators")
    if comm is None:
        return ""
    layouts = "; ".join(f"{name} {', '.join(f'{b / MIB:.0f}' for b in v['extra_bytes_per_stage'])} MiB over "
                        f"{', '.join(map(str, v['communicators_per_stage']))}"
                        for name, v in comm.get("by_layout", {}).items())
    return (f"; a communicator {comm['per_group_bytes'] / MIB:.0f} MiB ({comm['label']}"
            + (f": beyond one GPU's, {layouts} communicators per stage" if layouts else "") + ")")


def out_section(out: Path, name: str, command: str) -> tuple[list[str], list[Scored]]:
    links = json.loads((out / "links.json").read_text())
    machine = (out / "machine.txt").read_text().strip()
    lines = [f"## {name}", "", f"Command: `{command}`", "", "Machine:", "```", machine, "```", "",
             f"Links (benchmarks/search_links.py, {links['backend']}, {links['date']}; {links['label']}): p2p latency "
             f"{links['p2p_latency_us']:.0f} us, p2p {links['p2p_gbps']:.2f} GB/s, all-reduce bus "
             f"{links['allreduce_bus_gbps']:.2f} GB/s{_communicators(links)}.", ""]
    scored = []
    for model_dir in sorted(d for d in out.iterdir() if (d / "layers.json").exists() and d.name != COMMUNICATORS):
        model_lines, model_scored = model_section(model_dir)
        lines += [*model_lines, ""]
        scored += model_scored
    return lines, scored


def _summary_row(what: str, runs: list[Scored]) -> str:
    t = [abs(r.time) for r in runs]
    m = [abs(r.memory) for r in runs]
    return md_row(what, len(runs), f"{100 * statistics.median(t):.1f}%", f"{100 * max(t):.1f}%",
                  f"{sum(x <= TIME_TARGET for x in t)} of {len(t)}", f"{100 * statistics.median(m):.1f}%",
                  f"{100 * max(m):.1f}%", f"{sum(r.memory_ok for r in runs)} of {len(m)}")


def summary(scored: list[Scored]) -> list[str]:
    sizes = sorted({r.micro_batch for r in scored})
    time_ok, memory_ok = f"within {TIME_TARGET:.0%}", f"within {MEMORY_TARGET:.0%}"
    lines = ["## Summary", "", f"Absolute errors over the runs below; targets: iteration time {time_ok}, "
             f"peak memory per stage {memory_ok} (the worst stage of each run; a device need besides never "
             f"under by more than {UNDER_TARGET:.0%}).", "",
             *md_table("micro-batch size", "runs", "iteration time: median abs. error", "max", time_ok,
                       "peak memory: median abs. error", "max", "meets its target")]
    lines += [_summary_row(str(b), [r for r in scored if r.micro_batch == b]) for b in sizes]
    lines += [_summary_row("all", scored), ""]
    t = [abs(r.time) for r in scored]
    m = [abs(r.memory) for r in scored]
    lines.append(f"Over {len(scored)} runs: iteration time |error| median {100 * statistics.median(t):.1f}%, "
                 f"max {100 * max(t):.1f}%; peak memory |error| median {100 * statistics.median(m):.1f}%, "
                 f"max {100 * max(m):.1f}%.")
    e = [r.energy for r in scored if r.energy is not None]
    lines.append("" if not e else
                 f"Energy per iteration, on the {len(e)} runs whose energy was measured and whose order the search "
                 f"predicted at the clocks it ran: error {100 * min(e):+.1f} to {100 * max(e):+.1f}%, |error| median "
                 f"{100 * statistics.median(map(abs, e)):.1f}% (no target; the job's energy, all its GPUs).")
    return [*lines, ""]


def render(raws: list[Path], command: str | None = None) -> str:
    """The results file of one or more OUTs (ValueError: a raw path that is neither a folder nor an archive)."""
    sections, scored = [], []
    for raw in raws:
        with opened(raw) as out:
            lines, runs = out_section(out, f"`{shown_path(raw)}`", command or command_of(raw, "?"))
        sections += lines
        scored += runs
    head = ["# envpipe search: predicted vs measured (Aceso-style)", "",
            "Configurations the search predicts are trained for real and compared (Aceso, EuroSys'24, reports its "
            "iteration time within 0.4–5.3 % and memory within 12–16 %). Predicted: simulated by `envpipe search` "
            "from the layer profile (per-layer times and memory, measured) and the links, for what ran: the plan "
            "with its clocks where the clocks are under control (the CPU's sim clock); where they cannot be set "
            "(GPUs without envpipe-clockd) what the runtime deploys there, every unit at the top clock: the "
            "plan's order since 2026-11-27, 1F1B before (`1f1b (baseline ran)`). `*`: the order's prediction "
            "rebuilt after the run from the run's own layer profile, links and plan file by the search's code "
            "(`envpipe.search.evaluate.order_time_s`; found configurations carry it since). Peak memory: with the "
            "plan's order. Measured: examples/train_gpt.py's model and found configuration, EnvPipe runtime; "
            "iteration time per steady iteration = the slowest rank; peak memory per stage (the largest over its "
            "replicas), from before the model is built, the plan's order run (benchmarks/search_run.py): the "
            "device need, what must fit (the allocator's reserved peak plus what the process holds outside it; "
            "runs since 2026-11-29, against the search's device peak), or the allocator's peak (runs before, "
            "against the search's allocated peak). `graphed`: units replayed as CUDA graphs (`envpipe search "
            "--cuda-graphs`, the runtime's `cuda_graphs`). Error = (predicted − measured) / measured.", ""]
    tail = ["Rendered by `python benchmarks/search_results.py two-gpu " + " ".join(shown_path(r) for r in raws) + "`."]
    return "\n".join(head + (summary(scored) if scored else []) + sections + tail) + "\n"


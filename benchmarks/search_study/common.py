"""What every round of the one-GPU accuracy study reads: its raw files (benchmarks/results/search_accuracy/), a
held-out run's predictions against its measurements (Row), the tables and lines the rounds share (the runs, the
machine, the declaration, the engine model), and the study's targets."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, prediction_error

RAW = RESULTS / "search_accuracy"
GIB = 1 << 30
MS, US = 1e3, 1e6
TIME_TARGET, MEMORY_TARGET, SHORT_LIMIT = 0.05, 0.10, -0.03
_SMI_KEYS = ("Driver Version", "Product Name", "Persistence Mode", "Current Power Limit", "Default Power Limit")


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Row:
    kind: str  # fit | heldout
    model: str
    b: int
    M: int
    time_pred_s: float
    times_s: list[float]
    alloc_pred: int
    alloc_meas: int
    need_pred: int  # allocated + workspaces + outside the allocator: the device memory the run needs
    need_meas: int
    reserved_meas: int
    held_pred: int  # what the found configuration predicted the device would hold (its fragmentation then)
    inactive_split: int

    @property
    def time_meas_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def time_err(self) -> float:
        return prediction_error(self.time_pred_s, self.time_meas_s)

    @property
    def alloc_err(self) -> float:
        return prediction_error(self.alloc_pred, self.alloc_meas)

    @property
    def need_err(self) -> float:
        return prediction_error(self.need_pred, self.need_meas)

    def meets(self) -> bool:
        return (abs(self.time_err) <= TIME_TARGET and abs(self.need_err) <= MEMORY_TARGET
                and self.need_err >= SHORT_LIMIT)


def rows(call: Path, kind: str, engine: dict[str, Any]) -> list[Row]:
    fitted = {}
    if kind == "fit":
        details = load_json(call / "fit" / "details.json")["runs"]
        fitted = {(r["model"], r["micro_batch"]): r["predicted_s"] for r in details}
    out = []
    for model in sorted(d for d in (call / kind).iterdir() if (d / "layers.json").exists()):
        device_memory = load_json(model / "layers.json")["device_memory"]
        outside_pred = device_memory["outside_allocator_bytes"] + engine["outside_allocator_bytes"]
        for path in sorted((model / "runs").glob("b*.json"), key=lambda p: int(p.stem[1:])):
            run = load_json(path)
            pred, memory = run["predicted"], run["measured"]["memory"]
            # the search's allocated peak is the tensors'; the measured one holds the workspaces too
            alloc_pred = pred["peak_allocated_bytes_per_stage"][0] + device_memory["workspace_bytes"]
            time_pred = fitted[(model.name, run["micro_batch"])] if kind == "fit" else pred["baseline_iteration_time_s"]
            allocated = allocated_peak(memory)
            out.append(Row(kind, model.name, run["micro_batch"], run["microbatches"], time_pred,
                           run["measured"]["iteration_s"], alloc_pred, allocated, alloc_pred + outside_pred,
                           allocated + memory["outside_allocator_bytes"],
                           memory["reserved_peak_bytes"], pred["peak_memory_bytes_per_stage"][0],
                           memory["inactive_split_peak_bytes"]))
    return out


def allocated_peak(memory: dict[str, Any]) -> int:
    """A run's allocated peak; a graphed run's timed iterations hold their recordings' pools besides
    (benchmarks/search_accuracy.py)."""
    if "graph_pool_bytes" in memory:
        return max(memory["allocated_peak_bytes"], memory["steady_allocated_peak_bytes"] + memory["graph_pool_bytes"])
    return int(memory["allocated_peak_bytes"])


def summary(found: list[Row]) -> str:
    t = [r.time_err for r in found]
    m = [r.need_err for r in found]
    return (f"{len(found)} runs: iteration time |error| median {100 * statistics.median(map(abs, t)):.1f} %, max "
            f"{100 * max(map(abs, t)):.1f} %, within 5 % on {sum(abs(e) <= TIME_TARGET for e in t)}; device need "
            f"|error| max {100 * max(map(abs, m)):.1f} %, least {100 * min(m):+.1f} %; allocator's peak error "
            f"{100 * min(r.alloc_err for r in found):+.1f} to {100 * max(r.alloc_err for r in found):+.1f} %; "
            f"{sum(r.meets() for r in found)} of {len(found)} meet every target")


def smi_excerpt(call: Path) -> list[str]:
    keep = [line.strip() for line in (call / "nvidia-smi-q.txt").read_text().splitlines()
            if line.strip().startswith(_SMI_KEYS)]
    after = (call / "nvidia-smi-after.txt").read_text().splitlines()
    counters = [line.strip() for line in after[after.index(next(x for x in after if "Clocks Event Reasons Counters"
                                                                     in x)) + 1:][:2]]
    clocks = [f"{name}: {value}" for name, value in _clocks(call)]
    return [*keep[:5], *clocks, "after the runs, " + "; ".join(counters)]


def _clocks(call: Path) -> list[tuple[str, str]]:
    text = (call / "nvidia-smi-q.txt").read_text().splitlines()
    found = []
    for head in ("Applications Clocks", "Default Applications Clocks", "Max Clocks"):
        i = next(k for k, line in enumerate(text) if line.strip() == head)
        found.append((head, text[i + 1].split(":", 1)[1].strip() + " graphics"))
    return found


def held_rows(call: Path, runs: tuple[str, ...], engine_path: Path | None = None) -> list[Row]:
    """The held-out runs of a call's ``runs`` folders, scored with the engine model they were searched with
    (default: the call's engine.json)."""
    engine = load_json(engine_path or call / "engine.json")
    return [r for run in runs for r in rows(call / run, "heldout", engine)]


def _iterations(call: Path, run: str, model: str, b: int) -> int:
    return len(load_json(call / run / "heldout" / model / "runs" / f"b{b}.json")["measured"]["iteration_s"])


def held_table(found: list[Row], call: Path, runs: tuple[str, ...]) -> list[str]:
    lines = ["| model | b | M | timed iterations | iteration predicted (ms) | measured median (ms) | measured min-max "
             "(ms) | error | allocator's peak predicted / measured (GiB) | error | device need predicted / measured "
             "(GiB) | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in found:
        run = next(x for x in runs if (call / x / "heldout" / r.model).exists())
        lines.append(
            f"| {r.model} | {r.b} | {r.M} | {_iterations(call, run, r.model, r.b)} | {r.time_pred_s * MS:.1f} | "
            f"{r.time_meas_s * MS:.1f} | {min(r.times_s) * MS:.0f}-{max(r.times_s) * MS:.0f} | "
            f"{100 * r.time_err:+.1f} % | {r.alloc_pred / GIB:.2f} / {r.alloc_meas / GIB:.2f} | "
            f"{100 * r.alloc_err:+.1f} % | {r.need_pred / GIB:.2f} / {r.need_meas / GIB:.2f} | "
            f"{100 * r.need_err:+.1f} % |")
    return lines


def declared(call: Path) -> list[str]:
    return [load_json(call / "shapes.json")["about"], "", *models_table(call, "heldout")]


def models_table(call: Path, kind: str) -> list[str]:
    """The models a round's declaration gives its ``kind`` set (fit or heldout)."""
    return ["| model | family | blocks | hidden | heads | seq | vocab | micro-batch sizes |",
            "|---|---|---|---|---|---|---|---|",
            *[f"| {m['name']} | {m['model']['family']} | {m['model']['layers']} | {m['model']['hidden']} | "
              f"{m['model']['heads']} | {m['model']['seq']} | {m['model']['vocab']} | "
              f"{', '.join(map(str, m['micro_batch_sizes']))} |"
              for m in load_json(call / "shapes.json")[kind]["models"]]]


def machine_line(call: Path, run: str) -> str:
    m = (call / run / "machine.txt").read_text().splitlines()
    return (f"{m[0]} on one {m[-1].split(',')[0]} (driver {m[-1].split(',')[1].strip()}; host "
            f"{m[4].split(':')[1].strip()}, {m[2].split()[-1]} CPUs; code at commit {m[5].split()[-1]})")


def engine_line(path: Path) -> str:
    e = load_json(path)
    return (f"host scale {e['host_scale']:.2f}, engine host work per forward unit {e['unit_host_s'] * MS:.2f} ms and "
            f"per iteration {e['iteration_s'] * MS:.2f} ms, allocator fragmentation {100 * e['fragmentation']:.1f} %, "
            f"outside the allocator beyond the profile's {e['outside_allocator_bytes'] / 2**30:.3f} GiB "
            f"(\"{e['label']}\")")


def span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"

"""Per-iteration JSON lines per rank, and a final summary with a Gantt picture of measured units.

Files in the report directory: `iterations.rank<r>.jsonl` (one line per iteration: time, this GPU's
energy, clocks requested), `summary.json` and `gantt.png` (rank 0). Energy is labelled `measured`
(NVML counter) or `simulated` (SimClock's model).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envpipe.runtime.engine import UnitRecord

log = logging.getLogger(__name__)


@dataclass
class StageReport:
    stage: int
    times_s: list[float] = field(default_factory=list)
    energies_j: list[float | None] = field(default_factory=list)
    peak_memory_bytes: int = 0
    units: list[UnitRecord] = field(default_factory=list)  # the last measured iteration
    unit_energy_j: dict[str, Any] | None = None  # mean F/B unit energy, idle power (steady iterations)


class Reporter:
    """Collects this rank's iterations; `summarize` gathers all ranks (a collective call)."""

    def __init__(self, out_dir: str | Path, rank: int, stage: int, energy_label: str) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.energy_label = energy_label
        self.stage = StageReport(stage)
        self._lines = (self.dir / f"iterations.rank{rank}.jsonl").open("w")

    def iteration(
        self,
        index: int,
        phase: str,
        time_s: float,
        energy_j: float | None,
        clocks_requested: list[int],
        units: list[UnitRecord],
        loss: float | None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        line = {
            "iteration": index,
            "phase": phase,
            "stage": self.stage.stage,
            "time_s": time_s,
            "energy_j": energy_j,
            "energy": self.energy_label,
            "clocks_requested_mhz": clocks_requested,
            "loss": loss,
            "units_timed": bool(units),
            **(extra or {}),
        }
        self._lines.write(json.dumps(line) + "\n")
        self._lines.flush()
        if phase == "steady":
            self.stage.times_s.append(time_s)
            self.stage.energies_j.append(energy_j)
            if units:  # steady iterations time their units only now and then
                self.stage.units = list(units)

    def close(self) -> None:
        self._lines.close()


def slowest_per_iteration(per_rank: Iterable[Sequence[float]]) -> list[float]:
    """Per iteration, the largest of the ranks' values (the iteration waits for the slowest rank)."""
    return [max(xs) for xs in zip(*per_rank, strict=True)]


def median_energy(report: StageReport) -> float | None:
    """A rank's median steady-iteration energy; None when it ran none or one lacks its energy."""
    es = report.energies_j
    if not es or any(e is None for e in es):
        return None
    return statistics.median(e for e in es if e is not None)


def summarize(
    stages: list[StageReport],
    samples_per_iteration: int,
    energy_label: str,
    predicted_time_s: float | None,
    baseline: dict[str, float] | None,
) -> dict[str, Any]:
    """The final summary from every stage's report (stage order). Medians over steady iterations."""
    times = slowest_per_iteration(s.times_s for s in stages)
    t = statistics.median(times)
    per_stage = [median_energy(s) for s in stages]  # every stage has one entry per iteration (as times_s)
    energies = [e for e in per_stage if e is not None] if None not in per_stage else None
    summary: dict[str, Any] = {
        "iterations": len(times),
        "iteration_time_s": t,
        "throughput_samples_per_s": samples_per_iteration / t,
        "energy": energy_label,
        "energy_per_iteration_j": sum(energies) if energies is not None else None,
        "energy_per_gpu_j": energies,
        "peak_memory_bytes_per_stage": [s.peak_memory_bytes for s in stages],
        "unit_energy_per_stage": [s.unit_energy_j for s in stages],
        "predicted_iteration_time_s": predicted_time_s,
        "predicted_error": (t - predicted_time_s) / predicted_time_s if predicted_time_s else None,
    }
    if baseline and energies is not None:
        summary["baseline"] = baseline
        summary["energy_saving_vs_baseline"] = 1.0 - summary["energy_per_iteration_j"] / baseline["energy_j"]
        summary["slowdown_vs_baseline"] = t / baseline["time_s"] - 1.0
    return summary


def gantt(stages: list[StageReport], path: str | Path, title: str) -> None:
    """Draw the measured units of the last iteration: one row per stage, F light, B dark, clock as text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 0.6 * len(stages) + 1.2))
    for s in stages:
        for u in s.units:
            color = "#7fb3d5" if u.kind == "F" else "#1f618d"
            ax.barh(
                s.stage, u.end_s - u.start_s, left=u.start_s, color=color, edgecolor="black", linewidth=0.4
            )
            label = f"{u.kind}{u.mb}" + (f"\n{u.mhz}" if u.mhz else "")
            ax.text(
                (u.start_s + u.end_s) / 2,
                s.stage,
                label,
                ha="center",
                va="center",
                fontsize=6,
                color="white" if u.kind == "B" else "black",
            )
    ax.set_yticks([s.stage for s in stages], [f"stage {s.stage}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from iteration start (measured)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_summary(
    out_dir: str | Path, summary: dict[str, Any], stages: list[StageReport], title: str
) -> None:
    out = Path(out_dir)
    (out / "summary.json").write_text(
        json.dumps(
            {**summary, "units_last_iteration": [[asdict(u) for u in s.units] for s in stages]}, indent=1
        )
        + "\n"
    )
    try:
        gantt(stages, out / "gantt.png", title)
    except ImportError as exc:  # matplotlib is optional where only numbers are wanted
        log.warning("no Gantt picture (%s)", exc)

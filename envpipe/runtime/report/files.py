"""The run's report files, written by rank 0: summary.json (the typed summary), report.txt (its text
form, envpipe.runtime.report.text) and gantt.png (the units of the last timed iteration of what the steady
phase ran, one row per stage, coloured by the clock each unit ran at, its times labelled by their kind)."""

from __future__ import annotations

import logging
from pathlib import Path

from envpipe.atomicfile import atomic_write
from envpipe.runtime.report.text import render_report
from envpipe.runtime.summary import RunSummary

log = logging.getLogger(__name__)


def write_report(out_dir: str | Path, summary: RunSummary, gantt: bool = True) -> None:
    """summary.json and report.txt; gantt.png too unless ``gantt`` is False (the plan it shows is unchanged)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary.save(out / "summary.json")
    with atomic_write(out / "report.txt") as fh:
        fh.write(render_report(summary, out) + "\n")
    if not gantt:
        return
    try:
        draw_gantt(summary, out / "gantt.png")
    except ImportError as exc:  # matplotlib is optional where only numbers are wanted
        log.warning("no Gantt picture (%s)", exc)


def draw_gantt(summary: RunSummary, path: str | Path) -> None:
    """Measured units of the last timed iteration, coloured by the clock each ran at (the planner's drawing)."""
    from envpipe.plan.gantt import GanttBar, draw_bars

    bars = [GanttBar(stage, u.kind, u.mb, u.start_s, u.end_s, u.mhz)
            for stage, units in enumerate(summary.units_last_iteration) for u in units]
    if not bars:
        return  # no timed iteration (a run of stock DeepSpeed): nothing to draw
    plan, kind = summary.plan, summary.clock.time
    ran = "the plan" if plan is not None and plan.order_deployed else "1F1B all-max"
    title = f"one iteration of {ran}" + ("" if plan is None else f" (policy {plan.policy}, order {plan.order})")
    draw_bars(bars, path, title, label="simulated GPU" if kind.startswith("simulated") else "measured")

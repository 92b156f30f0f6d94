"""Human-readable outputs of a simulated plan: EnvPipe's text trace, a summary table, order names."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envpipe.plan.simulate import Timeline

TRACE_LEGEND = ("legend: each unit is `F3 1410 2.5`: F forward / B backward, micro-batch 3 (`F3.1`: on model "
                "chunk 1), its clock in MHz, the wait before it on its stage in ms; [brackets] mark the critical path")


def text_trace(tl: Timeline, freqs_mhz: np.ndarray) -> str:
    """EnvPipe's trace, after a one-line legend: ``Stage 0 | [F0 1980 0.0] F1 1260 0.0 ...``.

    Each unit shows its clock (MHz) and the wait before it on its stage (ms); brackets mark the
    critical path, other units are padded with spaces so columns line up as in EnvPipe's output.
    """
    dag = tl.dag
    critical = np.zeros(dag.num_units, bool)
    critical[tl.critical_path()] = True
    wait_ms = tl.wait * 1e3
    lines = [TRACE_LEGEND]
    for s, ids in enumerate(dag.order):
        cells = []
        for i in ids:
            body = f"{dag.label(i)} {int(freqs_mhz[i])} {wait_ms[i]:.1f}"
            cells.append(f"[{body}]" if critical[i] else f" {body} ")
        lines.append(f"Stage {s} | " + " ".join(cells))
    return "\n".join(lines)


def order_name(schedule: str, reschedule: Sequence[int], chunks: int = 1) -> str:
    """The unit order a plan runs, in words: ``EnvPipe's order, extra warm-up forwards r_s=[2, 1, 0]``."""
    if schedule == "envpipe":
        if any(reschedule):
            return f"EnvPipe's order, extra warm-up forwards r_s={list(reschedule)}"
        return "EnvPipe's order without extra warm-up forwards (1F1B's)"
    if schedule == "interleaved":
        return f"interleaved 1F1B, {chunks} chunks per stage"
    return {"1f1b": "1F1B", "gpipe": "GPipe", "dualpipev": "DualPipeV, 2 chunks per stage"}.get(schedule, schedule)


def summary_rows(tl: Timeline, baseline: Timeline, baseline_name: str) -> list[tuple[str, str]]:
    saving = 100.0 * (1.0 - tl.energy / baseline.energy)
    slowdown = 100.0 * (tl.iteration_time / baseline.iteration_time - 1.0)
    return [
        ("iteration time", f"{tl.iteration_time:.4f} s"),
        ("energy", f"{tl.energy:.1f} J"),
        (f"baseline ({baseline_name}) time", f"{baseline.iteration_time:.4f} s"),
        ("baseline energy", f"{baseline.energy:.1f} J"),
        ("energy saving", f"{saving:.2f} %"),
        ("slowdown", f"{slowdown:.2f} %"),
    ]


def summary_table(tl: Timeline, baseline: Timeline, title: str, baseline_name: str) -> str:
    rows = summary_rows(tl, baseline, baseline_name)
    width = max(len(k) for k, _ in rows)
    body = "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)
    return f"{title}\n{body}"

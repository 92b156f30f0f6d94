"""Human-readable outputs of a simulated plan: EnvPipe's text trace and a summary table."""

from __future__ import annotations

import numpy as np

from envpipe.plan.simulate import Timeline


def text_trace(tl: Timeline, freqs_mhz: np.ndarray) -> str:
    """EnvPipe's trace: ``Stage 0 | [F0 1980 0.0] F1 1260 0.0 ...``.

    Each unit shows its clock (MHz) and the wait before it on its stage (ms); brackets mark the
    critical path, other units are padded with spaces so columns line up as in EnvPipe's output.
    """
    dag = tl.dag
    critical = np.zeros(dag.num_units, bool)
    critical[tl.critical_path()] = True
    wait_ms = tl.wait * 1e3
    lines = []
    for s, ids in enumerate(dag.order):
        cells = []
        for i in ids:
            body = f"{dag.label(i)} {int(freqs_mhz[i])} {wait_ms[i]:.1f}"
            cells.append(f"[{body}]" if critical[i] else f" {body} ")
        lines.append(f"Stage {s} | " + " ".join(cells))
    return "\n".join(lines)


def summary_rows(tl: Timeline, baseline: Timeline) -> list[tuple[str, str]]:
    saving = 100.0 * (1.0 - tl.energy / baseline.energy)
    slowdown = 100.0 * (tl.iteration_time / baseline.iteration_time - 1.0)
    return [
        ("iteration time", f"{tl.iteration_time:.4f} s"),
        ("energy", f"{tl.energy:.1f} J"),
        ("baseline (1F1B all-max) time", f"{baseline.iteration_time:.4f} s"),
        ("baseline energy", f"{baseline.energy:.1f} J"),
        ("energy saving", f"{saving:.2f} %"),
        ("slowdown", f"{slowdown:.2f} %"),
    ]


def summary_table(tl: Timeline, baseline: Timeline, title: str) -> str:
    rows = summary_rows(tl, baseline)
    width = max(len(k) for k, _ in rows)
    body = "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)
    return f"{title}\n{body}"

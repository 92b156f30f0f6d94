"""Gantt picture of a simulated (or measured) iteration: one row per stage, units coloured by clock.

Bubbles are the light hatched gaps; critical-path units get a thick red outline. PNG or SVG by the
file's extension.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envpipe.plan.simulate import Timeline

FORMATS = (".png", ".svg")


def draw_gantt(tl: Timeline, freqs_mhz: np.ndarray, path: str | Path, title: str = "") -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"Gantt picture must be .png or .svg, got {path.name!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch

    dag = tl.dag
    S = dag.num_stages
    critical = np.zeros(dag.num_units, bool)
    critical[tl.critical_path()] = True
    f = np.asarray(freqs_mhz, float)
    norm = Normalize(vmin=f.min() - 1e-9 if f.min() == f.max() else f.min(), vmax=f.max())
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(min(24, 6 + 0.06 * dag.num_units / max(S, 1)), 1.2 + 0.55 * S))
    T = tl.iteration_time
    for s in range(S):
        y = S - 1 - s
        ax.broken_barh([(0, T)], (y - 0.4, 0.8), facecolors="#f3f3f3", hatch="////", edgecolor="#d0d0d0",
                       linewidth=0)
    for i in range(dag.num_units):
        y = S - 1 - int(dag.stage[i])
        dur = tl.end[i] - tl.start[i]
        ax.broken_barh([(tl.start[i], dur)], (y - 0.4, 0.8), facecolors=cmap(norm(f[i])),
                       edgecolors="red" if critical[i] else "black", linewidth=2.0 if critical[i] else 0.3)
        if dag.num_units <= 400:
            ax.text(tl.start[i] + dur / 2, y, dag.label(i), ha="center", va="center", fontsize=6,
                    color="white" if norm(f[i]) < 0.6 else "black")
    ax.set_yticks(range(S))
    ax.set_yticklabels([f"stage {S - 1 - y}" for y in range(S)])
    ax.set_xlim(0, T * 1.01)
    ax.set_xlabel("time (s)")
    ax.set_title(title or "simulated iteration")
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, label="SM clock (MHz)", pad=0.01)
    ax.legend(handles=[Patch(facecolor="white", edgecolor="red", linewidth=2, label="critical path"),
                       Patch(facecolor="#f3f3f3", hatch="////", edgecolor="#d0d0d0", label="idle (bubble)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize=7, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path

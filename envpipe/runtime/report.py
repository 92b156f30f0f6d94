"""The run's report files, written by rank 0: summary.json (the typed summary), report.txt (its text
form, envpipe.runtime.textreport) and gantt.png (the measured units of the last timed iteration, one
row per stage, coloured by the clock each unit ran at)."""

from __future__ import annotations

import logging
from pathlib import Path

from envpipe.runtime.summary import RunSummary
from envpipe.runtime.textreport import render

log = logging.getLogger(__name__)


def write_report(out_dir: str | Path, summary: RunSummary) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary.save(out / "summary.json")
    (out / "report.txt").write_text(render(summary, out) + "\n")
    try:
        gantt(summary, out / "gantt.png")
    except ImportError as exc:  # matplotlib is optional where only numbers are wanted
        log.warning("no Gantt picture (%s)", exc)


def gantt(summary: RunSummary, path: str | Path) -> None:
    """Measured units of the last timed iteration; F hatched, B plain; the colour is the unit's clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    rows = summary.units_last_iteration
    clocks = [u.mhz for units in rows for u in units if u.mhz is not None]
    norm = colors.Normalize(min(clocks, default=0), max(clocks, default=1) + (0 if len(set(clocks)) > 1 else 1))
    cmap = matplotlib.colormaps["viridis"]
    end = max((u.end_s for units in rows for u in units), default=1.0)
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(rows) + 1.6))
    for stage, units in enumerate(rows):
        for u in units:
            width = u.end_s - u.start_s
            color = "#bbbbbb" if u.mhz is None else cmap(norm(u.mhz))
            ax.barh(stage, width, left=u.start_s, color=color, edgecolor="black", linewidth=0.3,
                    hatch="//" if u.kind == "F" else None)
            if width > end / 60:  # a label only where it fits
                ax.text(u.start_s + width / 2, stage, f"{u.kind}{u.mb}", ha="center", va="center", fontsize=6)
    if clocks:
        fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="SM clock (MHz, planned)")
    ax.set_yticks(range(len(rows)), [f"stage {s}" for s in range(len(rows))])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the iteration's start (measured; F hatched, B plain)")
    plan = summary.plan
    ax.set_title("" if plan is None else f"{plan.policy}, {plan.order}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Gantt picture of one iteration: one row per stage, units coloured by clock with a clock colour bar.

Planned (simulated) and measured iterations are drawn by the same function, ``draw_bars``: the planner
passes a simulated timeline (``timeline_bars``), the runtime its measured units; every caller says which
(``label``: "simulated", "measured", "simulated GPU"), and the title and time axis say it too. Backward
units are drawn taller than forward ones, so the two stay apart when no label fits. Every unit gets its label
(``F12``) inside it: the figure is made wide enough for the shortest unit's label (up to a limit), and a unit
still too narrow gets it upright where that fits; only then, at hundreds of units per stage, none. Idle time
is hatched; the critical path, where the bars carry one, is outlined in red and joined by a red line (and only
then named in the legend). The colour bar's ticks are clocks in MHz, also when every unit runs at one clock,
and never closer than a label's height (of two clocks 15 MHz apart one is named). Long titles wrap instead of
being cut. PNG or SVG by the file's extension; the file is written atomically.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from envpipe.atomicfile import atomic_write
from envpipe.plan.simulate import Timeline

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = (".png", ".svg")
_DPI = 130
_FONT_PT = 6
_HEIGHT = {"F": 0.5, "B": 0.8}  # fraction of a stage row
_UNKNOWN_CLOCK = "#b0b0b0"
_MAX_LABELS = 4000  # beyond this many, text costs more time than it helps
_MAX_CLOCK_TICKS = 8  # up to this many distinct clocks, each gets its own tick on the colour bar (room permitting)
_MAX_WIDTH_IN = 24.0
_TITLE_PT = 10
_CHAR_PX = 0.62 * _FONT_PT * _DPI / 72  # one character of a unit's label, about
_LINE_PX = 1.3 * _FONT_PT * _DPI / 72  # one line of it
_TICK_PX = 1.3 * 10 * _DPI / 72  # one line of a colour-bar tick label (matplotlib's default 10 pt)
PATH_GID = "critical-path"  # the critical path's line, findable among the figure's artists


@dataclass(frozen=True)
class GanttBar:
    """One unit on the picture: its stage, kind ("F"/"B"), micro-batch, when it ran and at which clock."""

    stage: int
    kind: str
    mb: int
    start_s: float
    end_s: float
    clock_mhz: int | None = None  # None: not known (drawn grey)
    critical: bool = False
    chunk: int | None = None  # interleaved 1F1B, DualPipeV: the model chunk on this stage

    @property
    def name(self) -> str:
        return f"{self.kind}{self.mb}" + ("" if self.chunk is None else f".{self.chunk}")


def timeline_bars(tl: Timeline, freqs_mhz: np.ndarray) -> list[GanttBar]:
    """The units of a simulated timeline, ``freqs_mhz`` indexed like the timeline's DAG."""
    critical = np.zeros(tl.dag.num_units, bool)
    critical[tl.critical_path()] = True
    chunked = tl.dag.num_chunks > 1
    return [GanttBar(*tl.dag.unit(i), float(tl.start[i]), float(tl.end[i]), int(freqs_mhz[i]), bool(critical[i]),
                     int(tl.dag.chunk[i]) if chunked else None) for i in range(tl.dag.num_units)]


def draw_gantt(tl: Timeline, freqs_mhz: np.ndarray, path: str | Path, title: str = "", *,
               label: str = "simulated") -> Path:
    """The planner's picture of a simulated iteration."""
    return draw_bars(timeline_bars(tl, freqs_mhz), path, title or "one iteration", label=label,
                     span_s=tl.iteration_time)


def draw_bars(bars: Sequence[GanttBar], path: str | Path, title: str, *, label: str,
              span_s: float | None = None) -> Path:
    """Draw ``bars`` (see ``gantt_figure``) into ``path`` (.png or .svg, written atomically)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"Gantt picture must be .png or .svg, got {path.name!r}")
    import matplotlib.pyplot as plt

    fig = gantt_figure(bars, title, label=label, span_s=span_s)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format=path.suffix.lower()[1:], dpi=_DPI)
    plt.close(fig)
    return path


def gantt_figure(bars: Sequence[GanttBar], title: str, *, label: str, span_s: float | None = None) -> Figure:
    """The figure of ``bars`` (stages 0..S-1, S from the bars) over ``[0, span_s]`` (default: the last end),
    titled ``title (label)``; the caller closes it (``matplotlib.pyplot.close``)."""
    if not bars:
        raise ValueError("no units to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize, to_rgba
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    S = max(b.stage for b in bars) + 1
    span = span_s if span_s is not None else max(b.end_s for b in bars)
    clocks = sorted({b.clock_mhz for b in bars if b.clock_mhz is not None})
    lo, hi = (clocks[0], clocks[-1]) if clocks else (0, 1)
    norm = Normalize(vmin=lo - 0.5, vmax=hi + 0.5) if lo == hi else Normalize(vmin=lo, vmax=hi)
    cmap = plt.get_cmap("viridis")
    per_stage = len(bars) / S
    width = min(_MAX_WIDTH_IN, 6 + 0.06 * per_stage)
    fig, ax = plt.subplots(figsize=(width, min(30.0, 1.8 + 0.55 * S)), dpi=_DPI, layout="constrained")

    def row(stage: int) -> int:
        return S - 1 - stage

    for s in range(S):
        ax.broken_barh([(0, span)], (row(s) - 0.4, 0.8), facecolors="#f3f3f3", hatch="////", edgecolor="#d0d0d0",
                       linewidth=0)
    colours = [cmap(norm(b.clock_mhz)) if b.clock_mhz is not None else to_rgba(_UNKNOWN_CLOCK) for b in bars]
    groups: dict[tuple[int, str], list[int]] = {}
    for i, b in enumerate(bars):
        groups.setdefault((b.stage, b.kind), []).append(i)
    for (s, kind), ids in groups.items():  # one collection per stage and kind: fast also at 100k units
        height = _HEIGHT[kind]
        ax.broken_barh([(bars[i].start_s, bars[i].end_s - bars[i].start_s) for i in ids],
                       (row(s) - height / 2, height), facecolors=[colours[i] for i in ids],
                       edgecolors=["red" if bars[i].critical else "black" for i in ids],
                       linewidths=[1.6 if bars[i].critical else 0.3 for i in ids])
    handles: list[Artist] = [Patch(facecolor="white", edgecolor="black", linewidth=0.3,
                                   label="forward (short), backward (tall)")]
    critical = sorted((b for b in bars if b.critical), key=lambda b: b.start_s)
    if critical:  # through each critical unit along its row, then on to the next one
        xs = [x for b in critical for x in (b.start_s, b.end_s)]
        ys = [float(row(b.stage)) for b in critical for _ in range(2)]
        (line,) = ax.plot(xs, ys, color="red", linewidth=1.2, label="critical path", gid=PATH_GID, zorder=2.5)
        handles.append(line)
    handles.append(Patch(facecolor="#f3f3f3", hatch="////", edgecolor="#d0d0d0", label="idle (bubble)"))
    if S <= 64:
        ax.set_yticks(range(S))
        ax.set_yticklabels([f"stage {row(y)}" for y in range(S)])
    ax.set_ylim(-0.6, S - 0.4)
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel(f"time from the iteration's start (s, {label})")
    # wrapped to the figure's width (about 0.6 em per character), so that a long title is never cut
    chars = max(20, int(width * 72 / (0.6 * _TITLE_PT)))
    ax.set_title(textwrap.fill(f"{title} ({label})", chars, break_on_hyphens=False), fontsize=_TITLE_PT)
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="SM clock (MHz)",
                       pad=0.01) if clocks else None
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.draw_without_rendering()  # settles the layout, so that label widths can be measured in pixels
    if bar is not None:
        if len(clocks) <= _MAX_CLOCK_TICKS:
            bar.set_ticks(spaced_ticks(clocks, bar.ax.get_window_extent().height))
        bar.formatter = FuncFormatter(lambda x, _: f"{x:.0f}")  # whole MHz, never an offset like "+1.41e3"
        bar.update_ticks()
        fig.draw_without_rendering()
    needed = _needed_px_per_s(bars)
    for _ in range(3):  # wide enough for the shortest unit's label (the layout gives the axes most of the growth)
        short = (needed - _px_per_s(ax)) * span * 1.01 / _DPI
        if short <= 0 or fig.get_figwidth() >= _MAX_WIDTH_IN:
            break
        fig.set_figwidth(min(_MAX_WIDTH_IN, fig.get_figwidth() + 1.05 * short))
        fig.draw_without_rendering()
    _label_where_fits(ax, bars, colours, S)
    return fig


def spaced_ticks(clocks: Sequence[int], height_px: float) -> list[int]:
    """The clocks to name on a colour bar ``height_px`` high: the lowest and the highest, and between them each
    clock at least a tick label's height from the ones kept (1065 and 1080 MHz overprinted)."""
    if len(clocks) < 3:
        return list(clocks)
    gap = _TICK_PX * (clocks[-1] - clocks[0]) / max(height_px, 1.0)
    kept = [clocks[0]]
    for c in clocks[1:-1]:
        if c - kept[-1] >= gap and clocks[-1] - c >= gap:
            kept.append(c)
    return [*kept, clocks[-1]]


def _px_per_s(ax: Axes) -> float:
    (x0, _), (x1, _) = ax.transData.transform([(0, 0), (1, 1)])
    return abs(x1 - x0)


def _needed_px_per_s(bars: Sequence[GanttBar]) -> float:
    """The scale at which every label fits across its unit."""
    return max(((len(b.name) + 1) * _CHAR_PX / (b.end_s - b.start_s) for b in bars if b.end_s > b.start_s),
               default=0.0)


def labels_that_fit(bars: Sequence[GanttBar], px_per_s: float, px_per_row: float) -> list[tuple[int, bool]]:
    """(index, upright) of the bars whose label (``F12``) fits inside them at this scale (pixels per second and
    per row): across, or else upright (turned 90 degrees) where the unit is tall and wide enough for that."""
    fits = []
    for i, b in enumerate(bars):
        wide, tall = (b.end_s - b.start_s) * px_per_s, _HEIGHT[b.kind] * px_per_row
        text = (len(b.name) + 1) * _CHAR_PX
        if wide >= text and tall >= _LINE_PX:
            fits.append((i, False))
        elif wide >= _LINE_PX and tall >= text:
            fits.append((i, True))
    return fits


def _label_where_fits(ax: Axes, bars: Sequence[GanttBar], colours: Sequence[tuple[float, float, float, float]],
                      S: int) -> None:
    """Label the units whose label fits, measured in pixels once the layout is settled."""
    (x0, y0), (x1, y1) = ax.transData.transform([(0, 0), (1, 1)])
    fits = labels_that_fit(bars, abs(x1 - x0), abs(y1 - y0))
    if len(fits) > _MAX_LABELS:
        return
    for i, upright in fits:
        b = bars[i]
        dark = sum(colours[i][:3]) < 1.5
        ax.text((b.start_s + b.end_s) / 2, S - 1 - b.stage, b.name, ha="center", va="center", fontsize=_FONT_PT,
                color="white" if dark else "black", rotation=90 if upright else 0)

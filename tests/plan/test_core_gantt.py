"""Gantt pictures: labels only where they fit (legible at M = 96), a clock colour bar that reads in MHz also with
one clock, a full title that says simulated or measured, the critical path drawn where the legend names it, and
the same drawing for measured units (clocks may be unknown). Checked on the figure's artists, not on pixels."""

from __future__ import annotations

import re

import pytest

from envpipe.plan.case import PipelineCase
from envpipe.plan.evaluate import unit_clocks
from envpipe.plan.gantt import PATH_GID, GanttBar, draw_bars, draw_gantt, gantt_figure, labels_that_fit, timeline_bars
from envpipe.plan.planner import make_plan

plt = pytest.importorskip("matplotlib.pyplot")


def test_labels_only_where_they_fit():
    wide, narrow = GanttBar(0, "F", 95, 0.0, 1.0, 1410), GanttBar(0, "B", 95, 1.0, 1.01, 1410)
    assert labels_that_fit([wide, narrow], px_per_s=100, px_per_row=60) == [0]  # 100 px vs 1 px for "B95"
    assert labels_that_fit([wide, narrow], px_per_s=100_000, px_per_row=60) == [0, 1]
    assert labels_that_fit([wide, narrow], px_per_s=100_000, px_per_row=5) == []  # rows too low for text


def svg_labels(svg: str) -> list[str]:
    """Unit labels as matplotlib writes text into SVG (a comment before the glyphs)."""
    return re.findall(r"<!-- ([FB]\d+) -->", svg)


def planned(gpt3, m: int):
    result = make_plan(PipelineCase.of(gpt3, m, 83.64))
    return result, unit_clocks(result.plan, result.timeline.dag)


@pytest.mark.parametrize("m", [4, 24, 96])
def test_planned_picture_at_few_and_many_microbatches(gpt3, tmp_path, m):
    result, clocks = planned(gpt3, m)
    path = draw_gantt(result.timeline, clocks, tmp_path / "g.svg", f"M={m}")
    svg = path.read_text()
    labels = svg_labels(svg)
    assert "SM clock (MHz)" in svg  # the colour bar
    if m == 4:
        assert len(labels) >= 8 * 4  # the backward units at least carry their names
    else:  # units a few pixels wide: no label rather than a smear (M = 24 drew 384 overlapping labels)
        assert labels == []
    bars = timeline_bars(result.timeline, clocks)
    assert len(bars) == 2 * 8 * m and sum(b.critical for b in bars) == len(result.timeline.critical_path())


def colour_bar(fig):
    """The colour bar's visible tick labels and its offset text."""
    (bar,) = [ax for ax in fig.axes if ax.get_ylabel() == "SM clock (MHz)"]
    fig.canvas.draw()
    lo, hi = bar.get_ylim()
    shown = [t.get_text() for t, v in zip(bar.get_yticklabels(), bar.get_yticks(), strict=True) if lo <= v <= hi]
    return shown, bar.yaxis.get_offset_text().get_text()


def test_one_clock_reads_in_mhz_and_several_clocks_each_get_a_tick():
    one = [GanttBar(s, "F", 0, s, s + 1.0, 1410) for s in range(2)]
    fig = gantt_figure(one, "all at max", label="simulated")
    assert colour_bar(fig) == (["1410"], "")  # was ticks -1 .. 0 under an offset "+1.41e3"
    plt.close(fig)
    several = [GanttBar(0, "F", m, m, m + 1.0, f) for m, f in enumerate([1410, 1200, 1005])]
    fig = gantt_figure(several, "three clocks", label="simulated")
    assert colour_bar(fig) == (["1005", "1200", "1410"], "")
    plt.close(fig)
    many = [GanttBar(0, "F", m, m, m + 1.0, 900 + 15 * m) for m in range(30)]
    fig = gantt_figure(many, "thirty clocks", label="simulated")
    ticks, offset = colour_bar(fig)
    assert offset == "" and ticks == ["1000", "1200"]
    plt.close(fig)


def test_title_is_whole_and_says_what_was_drawn(gpt3):
    result, clocks = planned(gpt3, 4)
    title = "envpipe / envelope+balanced: 8 stages x 4 micro-batches on the GPT-3 175B A100 profile, " * 3
    fig = gantt_figure(timeline_bars(result.timeline, clocks), title.strip(), label="simulated")
    ax = fig.axes[0]
    assert " ".join(ax.get_title().split()) == f"{' '.join(title.split())} (simulated)"
    fig.canvas.draw()
    box, page = ax.title.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1  # not cut at the figure's edges
    assert "simulated" in ax.get_xlabel()
    plt.close(fig)


def test_critical_path_is_drawn_when_the_legend_names_it(gpt3):
    result, clocks = planned(gpt3, 4)
    bars = timeline_bars(result.timeline, clocks)
    fig = gantt_figure(bars, "planned", label="simulated")
    (line,) = [a for a in fig.axes[0].get_lines() if a.get_gid() == PATH_GID]
    critical = sorted((b for b in bars if b.critical), key=lambda b: b.start_s)
    assert list(line.get_xdata()) == [x for b in critical for x in (b.start_s, b.end_s)]
    assert "critical path" in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)
    measured = [GanttBar(b.stage, b.kind, b.mb, b.start_s, b.end_s, b.clock_mhz) for b in bars]  # no path known
    fig = gantt_figure(measured, "measured units", label="measured")
    assert not [a for a in fig.axes[0].get_lines() if a.get_gid() == PATH_GID]
    assert "critical path" not in [t.get_text() for t in fig.legends[0].get_texts()]
    assert fig.axes[0].get_title() == "measured units (measured)"
    plt.close(fig)


def test_measured_units_with_unknown_clocks(tmp_path):
    """The runtime's Gantt draws measured units through the same function; a unit may have no clock."""
    bars = [GanttBar(s, k, mb, t, t + 0.4, None if s == 0 else 1005 + 400 * (k == "B"))
            for s in range(2) for mb, (k, t) in enumerate([("F", 0.5 * s), ("B", 1.5 + 0.5 * s)])]
    path = draw_bars(bars, tmp_path / "m.png", "measured units", label="measured")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.png"]
    with pytest.raises(ValueError, match=r"must be \.png or \.svg"):
        draw_bars(bars, tmp_path / "m.pdf", "x", label="measured")
    assert plt.get_fignums() == []  # every figure drawn to a file is closed

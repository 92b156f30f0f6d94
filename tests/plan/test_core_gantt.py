"""Gantt pictures: labels only where they fit (legible at M = 96), a clock colour bar that reads in MHz also with
one clock, a full title that says simulated or measured, the critical path drawn where the legend names it, and
the same drawing for measured units (clocks may be unknown). Checked on the figure's artists, not on pixels."""

from __future__ import annotations

import itertools
import re

import pytest

from envpipe.plan.case import PipelineCase
from envpipe.plan.evaluate import unit_clocks
from envpipe.plan.gantt import PATH_GID, GanttBar, draw_bars, draw_gantt, gantt_figure, labels_that_fit, timeline_bars
from envpipe.plan.planner import make_plan

plt = pytest.importorskip("matplotlib.pyplot")


def test_labels_only_where_they_fit():
    wide, narrow = GanttBar(0, "F", 95, 0.0, 1.0, 1410), GanttBar(0, "B", 95, 1.0, 1.01, 1410)
    assert labels_that_fit([wide, narrow], px_per_s=100, px_per_row=60) == [(0, False)]  # 100 px vs 1 px
    assert labels_that_fit([wide, narrow], px_per_s=2000, px_per_row=60) == [(0, False), (1, True)]  # upright
    assert labels_that_fit([wide, narrow], px_per_s=100_000, px_per_row=60) == [(0, False), (1, False)]
    assert labels_that_fit([wide, narrow], px_per_s=100_000, px_per_row=5) == []  # rows too low for text


# `make demo`'s last iteration (2026-11-28): stage 0's first unit, the shortest, had no label, and the colour
# bar's 1065 and 1080 MHz overprinted each other.
DEMO = ["F0:0.0-7.3@1740 F1:7.3-16.9@855 F2:16.9-26.7@855 B0:31.8-49.3@1080 F3:49.3-58.8@855 B1:58.8-76.2@1080 "
        "F4:76.2-85.6@855 B2:85.6-103.3@1065 F5:103.3-112.7@855 B3:112.7-130.1@1065 F6:130.1-139.8@855 "
        "B4:139.8-157.3@1065 F7:157.3-166.8@855 B5:166.8-184.4@1065 B6:184.4-201.8@1080 B7:202.0-216.3@1740",
        "F0:7.3-15.4@1740 B0:15.4-31.8@1740 F1:31.8-40.1@1740 B1:40.1-56.4@1740 F2:56.4-64.5@1740 "
        "B2:64.5-80.7@1740 F3:80.7-88.8@1740 B3:88.8-105.1@1740 F4:105.1-113.1@1740 B4:113.1-129.2@1740 "
        "F5:129.2-137.5@1740 B5:137.5-153.6@1740 F6:153.6-161.8@1740 B6:161.8-178.0@1740 F7:178.0-186.1@1740 "
        "B7:186.1-201.9@1740"]


def demo_bars() -> list[GanttBar]:
    bars = []
    for stage, row in enumerate(DEMO):
        for unit in row.split():
            name, rest = unit.split(":")
            span, mhz = rest.split("@")
            a, b = (float(x) / 1000 for x in span.split("-"))
            bars.append(GanttBar(stage, name[0], int(name[1:]), a, b, int(mhz)))
    return bars


def test_every_unit_of_the_demo_has_its_label_and_no_tick_overprints():
    bars = demo_bars()
    fig = gantt_figure(bars, "one iteration of the plan", label="simulated GPU")
    fig.canvas.draw()
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts) == sorted(b.name for b in bars)
    for text in ax.texts:  # inside its own unit
        _, y = text.get_position()
        (unit,) = [b for b in bars if b.name == text.get_text() and b.stage == 1 - round(y)]
        box = text.get_window_extent().transformed(ax.transData.inverted())
        assert unit.start_s <= box.x0 and box.x1 <= unit.end_s, (unit, box)
    ticks, _ = colour_bar(fig)
    assert ticks[0] == "855" and ticks[-1] == "1740" and len(ticks) < 4  # 1065 and 1080: one of them named
    (bar,) = [a for a in fig.axes if a.get_ylabel() == "SM clock (MHz)"]
    boxes = sorted((t.get_window_extent() for t in bar.get_yticklabels() if t.get_text()), key=lambda b: b.y0)
    assert all(low.y1 <= high.y0 for low, high in itertools.pairwise(boxes))  # none overprints
    plt.close(fig)


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
    if m < 96:  # the figure is made wide enough for every label
        assert sorted(labels) == sorted(f"{k}{mb}" for _ in range(8) for k in "FB" for mb in range(m))
    else:  # at its widest, the backward units' labels fit upright, the forwards' not at all (no smear)
        assert sorted(labels) == sorted(f"B{mb}" for _ in range(8) for mb in range(m))
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

"""Gantt pictures: labels only where they fit (legible at M = 96), a clock colour bar, and the same drawing for
measured units (clocks may be unknown)."""

from __future__ import annotations

import re

import pytest

from envpipe.plan.gantt import GanttBar, draw_bars, draw_gantt, labels_that_fit, timeline_bars
from envpipe.plan.planner import make_plan

pytest.importorskip("matplotlib")


def test_labels_only_where_they_fit():
    wide, narrow = GanttBar(0, "F", 95, 0.0, 1.0, 1410), GanttBar(0, "B", 95, 1.0, 1.01, 1410)
    assert labels_that_fit([wide, narrow], px_per_s=100, px_per_row=60) == [0]  # 100 px vs 1 px for "B95"
    assert labels_that_fit([wide, narrow], px_per_s=100_000, px_per_row=60) == [0, 1]
    assert labels_that_fit([wide, narrow], px_per_s=100_000, px_per_row=5) == []  # rows too low for text


def svg_labels(svg: str) -> list[str]:
    """Unit labels as matplotlib writes text into SVG (a comment before the glyphs)."""
    return re.findall(r"<!-- ([FB]\d+) -->", svg)


@pytest.mark.parametrize("m", [4, 24, 96])
def test_planned_picture_at_few_and_many_microbatches(gpt3, tmp_path, m):
    result = make_plan(gpt3, m, idle_power_w=83.64)
    path = draw_gantt(result.timeline, result.reconfig.freqs_mhz, tmp_path / "g.svg", f"M={m}")
    svg = path.read_text()
    labels = svg_labels(svg)
    assert "SM clock (MHz)" in svg  # the colour bar
    if m == 4:
        assert len(labels) >= 8 * 4  # the backward units at least carry their names
    else:  # units a few pixels wide: no label rather than a smear (M = 24 drew 384 overlapping labels)
        assert labels == []
    bars = timeline_bars(result.timeline, result.reconfig.freqs_mhz)
    assert len(bars) == 2 * 8 * m and sum(b.critical for b in bars) == len(result.timeline.critical_path())


def test_measured_units_with_unknown_clocks(tmp_path):
    """The runtime's Gantt draws measured units through the same function; a unit may have no clock."""
    bars = [GanttBar(s, k, mb, t, t + 0.4, None if s == 0 else 1005 + 400 * (k == "B"))
            for s in range(2) for mb, (k, t) in enumerate([("F", 0.5 * s), ("B", 1.5 + 0.5 * s)])]
    path = draw_bars(bars, tmp_path / "m.png", "measured", xlabel="seconds from iteration start (measured)")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.png"]
    with pytest.raises(ValueError, match=r"must be \.png or \.svg"):
        draw_bars(bars, tmp_path / "m.pdf", "x")

"""The fair-service results are rendered from their raw JSON by the benchmark's own renderer."""

from __future__ import annotations

import json

from benchmarks.clockd_study.fair import render
from benchmarks.common import RESULTS


def test_the_committed_table_is_what_the_raw_results_render_to() -> None:
    raw = json.loads((RESULTS / "clockd_fair.json").read_text())
    assert render(raw) + "\n" == (RESULTS / "clockd_fair.md").read_text()


def test_the_committed_run_kept_every_well_behaved_lease_and_answered_every_request() -> None:
    raw = json.loads((RESULTS / "clockd_fair.json").read_text())
    abused = next(p for p in raw["phases"] if p["abuser"] is not None)
    assert len(abused["clients"]) == 8 and all(len(c["latencies_us"]) > 100 for c in abused["clients"])
    assert [c["errors"] for c in abused["clients"]] == [[]] * 8
    assert all(c["reattaches"] == 0 and c["uncontrolled_s"] == 0 for c in abused["clients"])
    assert abused["probe"]["errors"] == []

"""Which committed results file comes from which raw files and renderer, and which are written by their benchmark.

    python -m benchmarks.rendered              # re-render every rendered file; name those that differ
    python -m benchmarks.rendered --update     # rewrite them from their raw files
    python -m benchmarks.rendered search.md    # only these

A results file is either *rendered* (its raw files are committed under benchmarks/results/, and the renderer
reproduces it byte for byte: tests/benchmarks/test_rendered.py) or *written* by its benchmark script in one
step, with no raw file kept (CPU benchmarks that a developer re-runs; the file says when and where).
benchmarks/results/README.md indexes both.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import (
    demo_results,
    dev_loop,
    freqmodel_results,
    graphed_runtime,
    graphed_units,
    meter_probe,
    setup_time,
)
from benchmarks.clockd_study import fair as clockd_fair
from benchmarks.common import RESULTS, ROOT
from benchmarks.runtime_study import ablation, dp, dropin, rounds
from benchmarks.search_study import call1, call3, call4, call6, graphed, twogpu

RAW = RESULTS / "h200_runs"
RAW_H100 = RESULTS / "h100_runs"
RAW_H100X2 = RESULTS / "h100x2_runs"
RAW_H200X2 = RESULTS / "h200x2_runs"
RAW_H200X4 = RESULTS / "h200x4_runs"
# the 2-GPU runs of issue #34, in the order they ran (c1: the first device call, ...)
H200X2_DROPIN = ("c1_cnn_m8", "c1_gpt2_m8_r1", "c1_llama_m8_r1", "c1_llama_m8_rh", "c2_cnn_m8", "c2_gpt2_m8_rh",
                 "c2_gpt2_m16", "c2_dp2_gpt2_m8", "c2_llama_m8", "c2_llama_m16", "c3_dp2_gpt2_m8", "c3_dp2z1_gpt2_m8",
                 "c3_llama_m8", "c3_gpt2_m8", "c3_cnn_m8")
# the same issue's later calls, one 2-GPU job at a time on a 2 x H200 host of its own: rehearsed re-planning, and
# throughput on a quiet host
H200X2_QUIET = ("c4_gpt2_m8_rh", "c4_llama_m8_rh", "c4_gpt2_m8", "c4_cnn_m8_rh", "c5_gpt2_m8_rh", "c5_llama_m8_rh",
                "c5_cnn_m8_rh", "c5_llama_m8", "c6_gpt2_m8_rh", "c6_llama_m8_rh", "c6_cnn_m8_rh", "c6_gpt2_m16_rh")


@dataclass(frozen=True)
class Rendered:
    """A results file rendered from committed raw files."""

    name: str  # under benchmarks/results/
    raw: tuple[Path, ...]
    renderer: Callable[[list[Path]], str]
    script: str  # the renderer's command line, without its arguments

    def render(self) -> str:
        return self.renderer(list(self.raw))

    def command(self) -> str:
        return " ".join([self.script, *(str(p.relative_to(ROOT)) for p in self.raw)])


RENDERED = (
    Rendered("demo.md", (demo_results.RAW,), lambda raws: demo_results.render(raws[0]),
             "python -m benchmarks.demo_results render"),
    Rendered("clockd_fair.md", (RESULTS / "clockd_fair.json",),
             lambda raws: clockd_fair.render(clockd_fair.load(raws[0])) + "\n",
             "python benchmarks/clockd_results.py fair-render"),
    Rendered("dropin_h100.md", tuple(RAW_H100 / d for d in ("dropin_gpt2_0146", "dropin_llama_gpt2small_0150",
                                                           "dropin_gpt2small_0305", "dropin_llama_0309",
                                                           "dropin_llama_0445")),
             dropin.render_all, "python benchmarks/runtime_results.py dropin"),
    Rendered("dropin_h100x2.md", tuple(RAW_H100X2 / d for d in ("dropin_gpt2_llama_1653", "dropin_gpt2_1714",
                                                               "dropin_gpt2_cal10_1723", "dropin_gpt2_2030",
                                                               "dropin_llama_2036", "dropin_gpt2_2100",
                                                               "dropin_llama_2105", "dropin_gpt2_2332",
                                                               "dropin_llama_2338", "dropin_m16_2344",
                                                               "dropin_m8_2349")),
             dropin.render_all, "python benchmarks/runtime_results.py dropin"),
    Rendered("dropin_h200x2.md", tuple(RAW_H200X2 / d for d in H200X2_DROPIN), dropin.render_all,
             "python benchmarks/runtime_results.py dropin"),
    Rendered("dropin_h200x2_quiet.md", tuple(RAW_H200X2 / d for d in H200X2_QUIET), dropin.render_all,
             "python benchmarks/runtime_results.py dropin"),
    Rendered("dropin_ablation_h200x2.md", tuple(RAW_H200X2 / d for d in ("c3_ablation_gpt2", "c3_ablation_llama")),
             ablation.render, "python benchmarks/runtime_results.py ablation"),
    Rendered("dropin_h200x4.md", tuple(RAW_H200X4 / d for d in ("dropin_gpt2_x4_0626", "dropin_llama_x4_0633")),
             dropin.render_all, "python benchmarks/runtime_results.py dropin"),
    Rendered("dp_h200x4.md", (RAW_H200X4 / "dp_pp_x4_0722",), dp.render,
             "python benchmarks/runtime_results.py dp"),
    Rendered("meter_probe_h100x2.md", (RAW_H100X2 / "meter_probe_2317",), meter_probe.render,
             "python benchmarks/meter_probe.py --render"),
    Rendered("freqmodel.md", (RESULTS / "freqmodel.json",),
             lambda raws: freqmodel_results.render(json.loads(raws[0].read_text())),
             "python benchmarks/freqmodel_results.py"),
    Rendered("runtime_h200.md",
             tuple(RAW / d for d in ("pp2_m8", "pp4_m8", "pp2_m4-8-16_2008", "pp2_m4-8-16_2019", "pp2_m8_2115")),
             rounds.render_nov22, "python benchmarks/runtime_results.py rounds"),
    Rendered("runtime_h200_2026-11-23.md", (RAW / "runtime_llama_0454",),
             lambda raws: rounds.render(raws[0]), "python benchmarks/runtime_results.py rounds"),
    # their renderers read every raw file under benchmarks/results/search_accuracy/ themselves
    Rendered("search_accuracy.md", (), lambda _: call1.render(),
             "python benchmarks/search_results.py call1"),
    Rendered("search_accuracy_call3.md", (), lambda _: call3.render(),
             "python benchmarks/search_results.py call3"),
    Rendered("search_accuracy_call4.md", (), lambda _: call4.render(),
             "python benchmarks/search_results.py call4"),
    Rendered("search_accuracy_call6.md", (), lambda _: call6.render(),
             "python benchmarks/search_results.py call6"),
    Rendered("search_accuracy_call7.md", (), lambda _: graphed.render_call7(),
             "python benchmarks/search_results.py call7"),
    Rendered("search_accuracy_call8.md", (), lambda _: graphed.render_call8(),
             "python benchmarks/search_results.py call8"),
    Rendered("graphed_units_h200.md", (RESULTS / "graphed_units" / "h200_0916" / "graphed.json",),
             graphed_units.render, "python benchmarks/graphed_units.py render"),
    Rendered("graphed_runtime_h200.md", (RESULTS / "graphed_runtime" / "h200_1236",), graphed_runtime.render,
             "python benchmarks/graphed_runtime.py render"),
    Rendered("graphed_dropin_h200.md", tuple(RESULTS / "graphed_runtime" / d for d in ("dropin_h200_1301",
                                                                                        "dropin_h200x2_1310")),
             graphed_runtime.render_dropin, "python benchmarks/graphed_runtime.py render-dropin"),
    Rendered("search.md", (RAW / "search_gpt2_0544.tar.gz", RAW / "search_llama_0550.tar.gz"),
             twogpu.render, "python benchmarks/search_results.py two-gpu"),
    Rendered("search_h100x2.md", (RAW_H100X2 / "search_gpt2_28x1024_2053.tar.gz",), twogpu.render,
             "python benchmarks/search_results.py two-gpu"),
    Rendered("search_h200x2_call9.md", (RAW_H200X2 / "search_gpt2_36x1152_1825.tar.gz",
                                        RAW_H200X2 / "search_llama_24x1792_1833.tar.gz"), twogpu.render,
             "python benchmarks/search_results.py two-gpu"),
    Rendered("search_h200x2_call9_retrained.md", (RAW_H200X2 / "search_gpt2_36x1152_retrain_1845.tar.gz",
                                                  RAW_H200X2 / "search_llama_24x1792_retrain_1848.tar.gz"),
             twogpu.render, "python benchmarks/search_results.py two-gpu"),
    Rendered("search_h200x2_call10.md", (RAW_H200X2 / "search_gpt2_30x1344_2125.tar.gz",
                                         RAW_H200X2 / "search_llama_22x2176_2132.tar.gz"), twogpu.render,
             "python benchmarks/search_results.py two-gpu"),
    Rendered("search_h200x2_call11.md", (RAW_H200X2 / "search_gpt2_28x1408_2157.tar.gz",
                                         RAW_H200X2 / "search_gpt2_28x1408_rest_2205.tar.gz"), twogpu.render,
             "python benchmarks/search_results.py two-gpu"),
    Rendered("setup_time.md", tuple(RESULTS / "setup_runs" / d for d in ("pip_0431", "uv_0438", "uv_0444")),
             setup_time.render, "python -m benchmarks.setup_time render"),
    Rendered("dev_loop.md", tuple(RESULTS / "dev_loop_runs" / d for d in ("loop_1031", "loop_0605")), dev_loop.render,
             "python -m benchmarks.dev_loop render"),
)  # fmt: skip

# Written by their benchmark in one step (no raw file kept), by the script that writes them.
WRITTEN = {
    "clockd_faults.md": "python benchmarks/clockd_results.py faults --update",
    "clockd_latency.md": "python benchmarks/clockd_results.py latency --update",
    "clockd_readonly_h200.md":
        "python benchmarks/clockd_results.py readonly benchmarks/results/clockd_readonly_h200.md",
    "launch.md": "PYTHONPATH=.:launcher python benchmarks/bench_launch.py --update",
    "optimal.md": "python benchmarks/planner_results.py optimal --update",
    "planner.md": "python benchmarks/planner_results.py policies --update",
    "planner_scale.md": "python benchmarks/planner_results.py scale --reference REF --update",
    "planner_scale_2026-11-29.md": "python benchmarks/planner_results.py scale",
    "schedules.md": "python benchmarks/planner_results.py schedules --update",
    "search_cost.md": "python benchmarks/search_cost.py --layers LAYERS --memory-gib ... (twice, see the file)",
    "supervise.md": "PYTHONPATH=.:launcher python benchmarks/bench_supervise.py --update",
}


def by_name(names: list[str]) -> list[Rendered]:
    known = {r.name: r for r in RENDERED}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"not a rendered results file: {', '.join(unknown)} (rendered: {', '.join(known)})")
    return [known[n] for n in names] if names else list(RENDERED)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="results files to render (default: every rendered one)")
    p.add_argument("--update", action="store_true", help="rewrite the committed files from their raw files")
    args = p.parse_args(argv)
    differ = []
    for r in by_name(args.names):
        path = RESULTS / r.name
        text = r.render()
        if args.update:
            path.write_text(text)
            print(f"{r.name}: rendered by {r.command()}")
        elif not path.is_file() or path.read_text() != text:
            differ.append(r.name)
    if differ:
        print(f"differ from their raw files (--update rewrites them): {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

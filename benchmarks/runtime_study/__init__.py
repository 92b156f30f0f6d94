"""The runtime-vs-stock study's renderers, one module per kind of raw folder; `benchmarks/runtime_results.py`
is their one command line.

- `rounds`: benchmarks/runtime_h200.sh's output (2026-11-23 on: a folder per model with bench.json) and the raw
  folders of 2026-11-22 (read by their keys);
- `dropin`: benchmarks/runtime_bench.py's output folders (stock DeepSpeed against the drop-in engine, the plan's
  order, the rehearsal);
- `dp`: benchmarks/dp_h200.sh's output (data x pipeline parallelism, one run per engine and shape);
- `ablation`: benchmarks/dropin_ablation.py's output (the drop-in engine's parts, one at a time, in one job).
"""

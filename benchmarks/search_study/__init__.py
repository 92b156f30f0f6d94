"""The search study's renderers, one module per kind of raw folder or round; benchmarks/search_results.py and
benchmarks/search_accuracy_results.py are their command lines.

- `twogpu`: benchmarks/search_h200.sh's 2-GPU runs (a work directory or its tar archive);
- the one-GPU held-out rounds of benchmarks/search_accuracy.py (benchmarks/results/search_accuracy/): `call1`
  (calls 1-2, the default), `call3`, `call4` (with call5) and `call6`, on what they share: `common` (the raw files,
  the runs' rows and tables, the targets) and `per_unit` (the search's units against the measured ones, regimes).
"""

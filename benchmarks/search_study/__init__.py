"""The search study's renderers, one module per kind of raw folder or round; benchmarks/search_results.py is
their one command line.

- `twogpu`: benchmarks/search_h200.sh's 2-GPU runs (a work directory or its tar archive);
- the one-GPU held-out rounds of benchmarks/search_accuracy.py (benchmarks/results/search_accuracy/): `call1`
  (calls 1-2), `call3`, `call4` (with call5) and `call6`, on what they share: `common` (the raw files,
  the runs' rows and tables, the targets) and `per_unit` (the search's units against the measured ones, regimes).

The one-GPU rounds' predictions: held-out runs, as `envpipe search` wrote them into each found configuration before
the run (iteration time, the allocator's peak); per unit, the search's own time model (envpipe.search.timing) on
the run's layer profile with the engine model the run was searched with; fit runs, the fitted model's (in
sample). Error = (predicted - measured) / measured.
"""

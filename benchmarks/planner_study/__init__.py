"""The planner study: the planners on the shipped measured profiles (energies and times simulated, planning time
measured), one module per results file; `benchmarks/planner_results.py` is their one command line:

- `policies`: EnvPipe's policies and their planning speed (results/planner.md);
- `optimal`: the optimal planner against Perseus and EnvPipe, its gap to the exact MILP, speed and scaling
  (results/optimal.md);
- `scale`: the optimal planner at the scale of real jobs, side by side with an older checkout
  (results/planner_scale.md);
- `schedules`: the pipeline schedules side by side (results/schedules.md).

Nothing here imports envpipe at import time: scale's child processes import this package with an older
checkout's envpipe first on sys.path.
"""

"""EnvPipe on DeepSpeed's pipeline engine. The public entry is `envpipe.initialize` (entry.py); the rest, by layer:

- the entry and the job: `entry` (initialize: config, clock, engine, exits), `config` (the `envpipe` block),
  `clocks` (sim, clockd, NVML read-only), `distributed` (process groups in and out), `stock` (stock DeepSpeed
  timed and metered alike, for comparisons);
- `engine/`: `engine` (PipelineEngine subclass: unit orders, clocks, unit timing, a simulated GPU's virtual
  time; train_batch / checkpoints hand over to the run), `schedule` (the instruction streams), `spin` (a delay on
  the GPU: a rehearsal's stretch);
- the run: `run` (EnvPipeRun: the phases inside train_batch, the report, checkpoints), `rig` (what the phases
  work on, and the `Step` they yield), `decision` (the plain types the phases hand on: `CalibrationResult`, `Decision`,
  `Decided`), `state` (what a checkpoint carries);
- `phases/`: `calibrate`, `profiling`, `decide` (+ `straggler`), `reconfigure`, `rehearse`, `steady` (+ `noharm`:
  whether it keeps what it deployed), `steps` (how many train_batch calls the whole report takes);
- `measure/`: `timing` (unit times -> the simulator's inputs), `replicas` (data parallelism), `iterations`
  (per-iteration lines), `collective` (gather, agree), `memory` (activation bytes, static bytes);
- `summary` (the typed RunSummary and its schema, which every layer writes to);
- `report/`: `collect` (every rank's record -> the summary), `prediction` (the energy model against the counter,
  the oracle), `files` and `text` (summary.json, report.txt and gantt.png; the report in words), `monitor` (events
  to DeepSpeed's monitors).

Importing this package loads nothing heavy; its modules import torch and DeepSpeed.
"""

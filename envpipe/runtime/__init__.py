"""EnvPipe on DeepSpeed's pipeline engine. The public entry is `envpipe.initialize` (entry.py); the rest, by layer:

- the entry and the job: `entry` (initialize: config, clock, engine, exits), `config` (the `envpipe` block),
  `clocks` (sim, clockd, NVML read-only), `distributed` (process groups in and out), `stock` (stock DeepSpeed
  timed and metered alike, for comparisons);
- `engine/`: `engine` (PipelineEngine subclass: unit orders, clocks, unit timing, a simulated GPU's virtual
  time; train_batch / checkpoints hand over to the run), `schedule` (the instruction streams), `spin` (a delay on
  the GPU: a rehearsal's stretch), `graphs` (a stage's units replayed as CUDA graphs: `cuda_graphs`), `hp_grads`
  (BF16_Optimizer's gradient hand-off in one multi-tensor add);
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

Its public names (`__all__`, listed in CONTRIBUTING.md's "Public API") are what a training script needs around
`envpipe.initialize`: the config read and checked before any process group (`read_config`, `check_config`, the
`envpipe` block's `EnvPipeConfig`), the pipeline's shape, the process groups in and out, stock DeepSpeed timed and
metered alike (`StockRecorder`) and the report in words (`render_report`). Importing this package loads nothing
heavy; a name loads its module on first use, and the modules import torch and DeepSpeed.
"""

import importlib
from typing import Any

__all__ = [
    "CALIBRATION_LEAST",
    "ClockKind",
    "EnvPipeConfig",
    "StockRecorder",
    "check_config",
    "exit_process",
    "init_distributed",
    "pipeline_shape",
    "read_config",
    "render_report",
]
_HOME = {"CALIBRATION_LEAST": "config", "ClockKind": "config", "EnvPipeConfig": "config", "StockRecorder": "stock",
         "check_config": "entry", "exit_process": "distributed", "init_distributed": "distributed",
         "pipeline_shape": "measure.replicas", "read_config": "entry", "render_report": "report.text"}


def __getattr__(name: str) -> Any:
    if name in _HOME:  # imported on use: `from envpipe.runtime import EnvPipeConfig` loads no DeepSpeed
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

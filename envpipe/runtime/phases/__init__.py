"""The phases `EnvPipeRun` sequences inside train_batch, each a generator of `Step`s over a `Rig`: `calibrate`,
`profiling`, `decide` (+ `straggler`), `reconfigure`, `rehearse`, `steady` (+ `noharm`, whether it keeps what it
deployed); `steps` counts the train_batch calls they take before the report is complete."""

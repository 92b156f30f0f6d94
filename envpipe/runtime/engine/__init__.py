"""DeepSpeed's side: `engine` (the PipelineEngine subclass: unit orders, clocks, unit timing, a simulated GPU's
virtual time), `schedule` (the instruction streams), `spin` (a delay on the GPU, for a rehearsal's stretches)."""

"""What the phases measure with: `timing` (unit times -> the simulator's inputs), `replicas` (data parallelism:
per-stage times of each replica, the straggler), `iterations` (per-iteration lines), `collective` (gather,
agree), `memory` (activation bytes, static bytes)."""

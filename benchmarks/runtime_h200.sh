#!/usr/bin/env bash
# Stock DeepSpeed 1F1B vs the EnvPipe runtime (1F1B order and EnvPipe order) on the same GPT-2 model,
# 2 GPUs, clocks left as found (no clock is ever set: without envpipe-clockd the runtime records clock
# requests only and reads the NVML energy counter). Writes reports under $OUT (or ./runtime-bench).
# Usage on a 2-GPU machine: bash benchmarks/runtime_h200.sh [extra train_gpt.py args]
set -euo pipefail
OUT=${OUT:-runtime-bench}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
{ date -u; uname -a; nproc; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv;
  $PY -c 'import torch, deepspeed, transformers; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)'; } > "$OUT/machine.txt" 2>&1
COMMON=(--model gpt2 --layers 16 --hidden 2048 --heads 16 --seq 1024 --micro-batch 4 --microbatches 8
        --steps 12 --calibration-steps 3 --clock daemon "$@")
run() {  # name, then args
  local name=$1; shift
  $PY -m torch.distributed.run --nproc-per-node 2 examples/train_gpt.py "${COMMON[@]}" --report-dir "$OUT/$name" "$@" \
    > "$OUT/$name.log" 2>&1 || { echo "$name failed"; tail -40 "$OUT/$name.log"; exit 1; }
  echo "$name done"
}
run stock --engine stock
ENVPIPE_TYPE=baseline ENVPIPE_SCHEDULING=1f1b run envpipe_1f1b
ENVPIPE_TYPE=baseline ENVPIPE_SCHEDULING=envpipe run envpipe_order
ENVPIPE_TYPE=baseline ENVPIPE_SCHEDULING=1f1b run envpipe_1f1b_again

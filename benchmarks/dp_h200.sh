#!/usr/bin/env bash
# Data x pipeline parallel on the lent GPUs: DP1xPP2 on 2 GPUs and, with 4 GPUs, DP2xPP2 (also ZeRO-1);
# stock DeepSpeed 1F1B vs the EnvPipe runtime (EnvPipe order, 'baseline' type). Clocks are NEVER
# changed: --clock readonly leaves every clock as it is
# and reads the NVML energy counter (measured). Job-wide energy = every GPU of every node.
# The gradient all-reduce (ReduceTiedGrads + ReduceGrads) and the tail (step end - last unit end) are
# measured per replica and compared with the calibrated tail the runtime's prediction used (simulated).
# Runs that need more GPUs than are visible (torch.cuda.device_count()) are skipped, each with a line in
# the table saying so; a failed run is listed as failed and the script goes on (exit status 1 at the end).
#   OUT=dp-bench bash benchmarks/dp_h200.sh          # GPUs; about 3-4 min on 4 x H200
#   TINY=1 OUT=/tmp/dp-tiny bash benchmarks/dp_h200.sh   # CPU smoke run (gloo, sim clock, tiny model)
#   TINY=1 GPUS=2 ...                                 # CPU, as if 2 GPUs were visible (the skip path)
# DeepSpeed missing: the wheels carried in .whl/ are unpacked onto PYTHONPATH first (benchmarks/deepspeed_whl.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-dp-bench}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
source benchmarks/deepspeed_whl.sh
if [ "${TINY:-0}" = 1 ]; then
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  GPUS=${GPUS:-4}
  MODEL=(--tiny --microbatches 4 --steps 4 --calibration-steps 1 --clock sim)
else
  unset ENVPIPE_CLOCKD_SOCKET 2>/dev/null || true
  GPUS=${GPUS:-$($PY -c 'import torch; print(torch.cuda.device_count())')}
  MODEL=(--model gpt2 --layers 16 --hidden 2048 --heads 16 --seq 1024 --micro-batch 4 --microbatches 8
         --steps 13 --calibration-steps 3 --clock readonly)
fi
{ date -u; uname -a; nproc; command -v nvidia-smi > /dev/null &&
    nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv;
  $PY -c 'import torch, deepspeed, transformers; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)'; } > "$OUT/machine.txt" 2>&1
PORT=${PORT:-29611}
RUNS=()
FAILED=0
run() {  # name, processes, then train_gpt.py args
  local name=$1 nproc=$2; shift 2
  local t0=$SECONDS
  RUNS+=("$name")
  rm -f "$OUT/$name.skipped" "$OUT/$name.failed"
  if [ "$GPUS" -lt "$nproc" ]; then  # runtime_results.py dp-table prints the reason in the run's row
    echo "skipped: needs $nproc GPUs, $GPUS visible" | tee "$OUT/$name.skipped"
    return
  fi
  PORT=$((PORT + 1))
  if ! ENVPIPE_TYPE=baseline ENVPIPE_SCHEDULING=envpipe $PY -m torch.distributed.run --nproc-per-node "$nproc" \
    --master-port "$PORT" examples/train_gpt.py "${MODEL[@]}" --pipeline-stages 2 --report-dir "$OUT/$name" "$@" \
    > "$OUT/$name.log" 2>&1; then
    echo "$name failed (log: $OUT/$name.log)" | tee "$OUT/$name.failed"; tail -40 "$OUT/$name.log"; FAILED=1
    return
  fi
  echo "$name done in $((SECONDS - t0)) s"
}
run stock_dp1 2 --engine stock
run envpipe_dp1 2
run stock_dp2 4 --engine stock
run envpipe_dp2 4
run stock_dp2_zero1 4 --engine stock --zero-stage 1
run envpipe_dp2_zero1 4 --zero-stage 1
$PY benchmarks/runtime_results.py dp-table "$OUT" "${RUNS[@]}" | tee "$OUT/table.md"
exit $FAILED

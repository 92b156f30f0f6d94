#!/usr/bin/env bash
# Stock DeepSpeed 1F1B vs the EnvPipe runtime (1F1B and EnvPipe order) on the same GPT-2 model, clocks
# left as found: without envpipe-clockd the runtime only records clock requests and reads the NVML
# energy counter. Never changes clocks or power limits. Writes $OUT/machine.txt, $OUT/pp<P>/bench.json
# (benchmarks/runtime_bench.py, one run per stage count) and $OUT/runtime_h200.md (the results file).
#
#   OUT=/tmp/rt bash benchmarks/runtime_h200.sh                 # 2 stages (M=8), then 4 stages (M=4,8,16)
#   STAGES="4" MS_4=8 ROUNDS=5 bash benchmarks/runtime_h200.sh  # one configuration, more rounds
#   CPU=1 OUT=/tmp/rt bash benchmarks/runtime_h200.sh           # tiny model on CPU: checks the script's logic
#
# DeepSpeed missing (the lent machines): the wheels carried in .whl/ are unpacked onto PYTHONPATH first
# (benchmarks/deepspeed_whl.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runtime-bench}
PY=${PYTHON:-python3}
STAGES=${STAGES:-"2 4"}
MS_2=${MS_2:-8}
MS_4=${MS_4:-4,8,16}
ROUNDS=${ROUNDS:-6}
STEPS=${STEPS:-10}
EXTRA=()
if [ "${CPU:-0}" = 1 ]; then
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  EXTRA=(--cpu)
fi
mkdir -p "$OUT"
source benchmarks/deepspeed_whl.sh
{ date -u; uname -srm; echo "cpus: $(nproc)"
  if [ "${CPU:-0}" != 1 ]; then
    nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv
  fi
  $PY -c 'import torch, deepspeed, transformers; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)'
} > "$OUT/machine.txt" 2>&1
for P in $STAGES; do
  ms_var="MS_$P"
  MS=${!ms_var:-8}
  echo "$(date -u +%T) $P stages, M=$MS"
  $PY -m torch.distributed.run --standalone --nproc-per-node "$P" benchmarks/runtime_bench.py \
    --out "$OUT/pp$P" --microbatches "$MS" --rounds "$ROUNDS" --steps "$STEPS" --calibration-steps 3 \
    "${EXTRA[@]}" "$@" > "$OUT/pp$P.log" 2>&1 || { echo "$P stages failed"; tail -40 "$OUT/pp$P.log"; }
  grep -h "done in" "$OUT/pp$P.log" || true
done
$PY benchmarks/runtime_results.py "$OUT" --command "STAGES=\"$STAGES\" MS_2=$MS_2 MS_4=$MS_4 ROUNDS=$ROUNDS STEPS=$STEPS bash benchmarks/runtime_h200.sh" \
  > "$OUT/runtime_h200.md"
echo "$(date -u +%T) results: $OUT/runtime_h200.md"

#!/usr/bin/env bash
# Stock DeepSpeed 1F1B vs the EnvPipe runtime on GPT-2 and Llama configurations, 2 pipeline stages, clocks left
# as found: without envpipe-clockd the runtime's 'auto' clock runs at default clocks and reads the NVML energy
# counter. Never changes clocks or power limits. Writes $OUT/machine.txt, $OUT/<model>/bench.json
# (benchmarks/runtime_bench.py) and $OUT/runtime_h200.md (benchmarks/runtime_results.py).
#
#   OUT=/tmp/rt bash benchmarks/runtime_h200.sh                   # GPT-2 M=8,16 and Llama M=8 on 2 GPUs
#   MODELS=gpt2 MS_gpt2=8 ROUNDS=6 bash benchmarks/runtime_h200.sh  # one configuration, more rounds
#   CPU=1 OUT=/tmp/rt bash benchmarks/runtime_h200.sh             # tiny model on CPU: checks the script's logic
#
# DeepSpeed missing (the lent machines): the wheels carried in .whl/ are unpacked onto PYTHONPATH first
# (benchmarks/deepspeed_whl.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runtime-bench}
PY=${PYTHON:-python3}
STAGES=${STAGES:-2}
MODELS=${MODELS:-"gpt2 llama"}
MS_gpt2=${MS_gpt2:-8,16}
MS_llama=${MS_llama:-8}
ROUNDS=${ROUNDS:-4}
STEPS=${STEPS:-15}
ARGS_gpt2=()  # runtime_bench.py's default: GPT-2, 16 layers, hidden 2048, seq 1024, micro-batch 4
ARGS_llama=(--model llama --seq 2048 --micro-batch 2)
EXTRA=()
if [ "${CPU:-0}" = 1 ]; then
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  EXTRA=(--cpu)
  ARGS_llama=(--model llama)
fi
mkdir -p "$OUT"
source benchmarks/deepspeed_whl.sh
{ date -u; uname -srm; echo "cpus: $(nproc)"
  if [ "${CPU:-0}" != 1 ]; then
    nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv
  fi
  $PY -c 'import torch, deepspeed, transformers; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)'
} > "$OUT/machine.txt" 2>&1
FAILED=0
for MODEL in $MODELS; do
  ms_var="MS_$MODEL" args_var="ARGS_$MODEL[@]"
  echo "$(date -u +%T) $MODEL, $STAGES stages, M=${!ms_var}"
  $PY -m torch.distributed.run --standalone --nproc-per-node "$STAGES" benchmarks/runtime_bench.py \
    --out "$OUT/$MODEL" --microbatches "${!ms_var}" --rounds "$ROUNDS" --steps "$STEPS" "${EXTRA[@]}" \
    "${!args_var}" > "$OUT/$MODEL.log" 2>&1 || { echo "$MODEL failed"; tail -40 "$OUT/$MODEL.log"; FAILED=1; }
  grep -h "done in" "$OUT/$MODEL.log" || true
done
$PY benchmarks/runtime_results.py "$OUT" --command "MODELS=\"$MODELS\" MS_gpt2=$MS_gpt2 MS_llama=$MS_llama ROUNDS=$ROUNDS STEPS=$STEPS bash benchmarks/runtime_h200.sh" \
  > "$OUT/runtime_h200.md"
echo "$(date -u +%T) results: $OUT/runtime_h200.md"
exit $FAILED

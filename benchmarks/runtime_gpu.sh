#!/usr/bin/env bash
# Stock DeepSpeed against EnvPipe's drop-in engine on the lent GPUs, each engine in processes of its own
# (benchmarks/runtime_bench.py), then the table (benchmarks/runtime_results.py dropin). Clocks are NEVER changed: the
# drop-in engine runs without envpipe-clockd (clock 'auto': default clocks, the NVML energy counter).
#
#   OUT=/tmp/rt bash benchmarks/runtime_gpu.sh                                  # 1 GPU, GPT-2 16 x 2048
#   GPUS=2 MODELS=gpt2-16x2048,llama-16x2048 MICROBATCHES=8 ROUNDS=4 PLAN_RUNS=1 OUT=/tmp/rt bash benchmarks/runtime_gpu.sh
#   GPUS=2 MODELS=cnn ROUNDS=1 REHEARSE_RUNS=1 PLAN_COMPARE=4 OUT=/tmp/rt bash benchmarks/runtime_gpu.sh  # the CNN
#   GPUS=2 PIPELINE_STAGES=1 ZERO_STAGE=1 OUT=/tmp/rt bash benchmarks/runtime_gpu.sh    # DP 2 x PP 1, ZeRO-1
#   CPU=1 OUT=/tmp/rt bash benchmarks/runtime_gpu.sh                            # tiny, 2 CPU processes: the logic
#
# DeepSpeed missing (the lent machines): the wheels carried in .whl/ are unpacked onto PYTHONPATH first
# (benchmarks/deepspeed_whl.sh). Writes OUT/ (raw runs) and OUT/dropin.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runtime-bench}
PY=${PYTHON:-python3}
ARGS=(--out "$OUT" --models "${MODELS:-gpt2-16x2048}" --gpus "${GPUS:-1}" --rounds "${ROUNDS:-2}"
      --steps "${STEPS:-20}" --microbatches "${MICROBATCHES:-8}" --plan-runs "${PLAN_RUNS:-0}"
      --rehearse-runs "${REHEARSE_RUNS:-0}" --plan-compare "${PLAN_COMPARE:-2}")
if [ -n "${PIPELINE_STAGES:-}" ]; then ARGS+=(--pipeline-stages "$PIPELINE_STAGES"); fi
if [ -n "${ZERO_STAGE:-}" ]; then ARGS+=(--zero-stage "$ZERO_STAGE"); fi
if [ "${CPU:-0}" = 1 ]; then ARGS+=(--cpu); fi
source benchmarks/deepspeed_whl.sh
status=0
$PY benchmarks/runtime_bench.py "${ARGS[@]}" || status=$?
$PY benchmarks/runtime_results.py dropin "$OUT" > "$OUT/dropin.md"
echo "results: $OUT/dropin.md"
exit $status

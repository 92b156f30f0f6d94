#!/usr/bin/env bash
# One call of the one-GPU accuracy benchmark of `envpipe search` (benchmarks/search_accuracy.py) on a lent GPU,
# with what the results file says of the machine: OUT/raw/{machine.txt, nvidia-smi-q.txt (before),
# nvidia-smi-after.txt (clock event counters after), run.log} beside the driver's runs, and everything in
# OUT/search_accuracy.tar.gz (the driver remakes it after every run: a call stopped at its limit keeps what it
# measured). NEVER changes clocks or power limits. DeepSpeed missing (the lent machines): the wheels in .whl/
# are unpacked first (deepspeed_whl.sh). COMMIT names the code (a carried copy has no git history).
#
#   OUT=/tmp/acc COMMIT=abc1234 bash benchmarks/search_accuracy_gpu.sh --sets heldout \
#       --shapes benchmarks/results/search_accuracy/call3/shapes.json \
#       --engine-model benchmarks/results/search_accuracy/call3/engine.json --deadline-s 265
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
PY=${PYTHON:-python3}
. benchmarks/deepspeed_whl.sh
. benchmarks/machine_info.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT/raw"
machine_info "$OUT/raw"
$PY benchmarks/search_accuracy.py --out "$OUT/raw" --archive "$OUT" "$@" 2>&1 | tee "$OUT/raw/run.log"
status=$?
nvidia-smi -q -d PERFORMANCE > "$OUT/raw/nvidia-smi-after.txt"
tar czf "$OUT/.search_accuracy.tar.gz" -C "$OUT/raw" . && mv "$OUT/.search_accuracy.tar.gz" "$OUT/search_accuracy.tar.gz"
exit $status

#!/usr/bin/env bash
# One call of benchmarks/graphed_runtime.py on a lent GPU, with what its results file says of the machine:
# machine.txt, nvidia-smi-q.txt (before), nvidia-smi-after.txt (clock event counters after) and run.log beside
# the runs in RAW (default /tmp/graphed_runtime), all packed into OUT/graphed_runtime.tar.gz at the end. The runs
# stop after LIMIT seconds (default 540). NEVER changes clocks or power limits. DeepSpeed missing (the lent
# machines): the wheels in .whl/ are unpacked first (deepspeed_whl.sh). COMMIT names the code (a carried copy
# has no git history).
#
#   OUT=/tmp/g COMMIT=abc1234 bash benchmarks/graphed_runtime_gpu.sh --deadline-s 470 CONFIG...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
PY=${PYTHON:-python3}
. benchmarks/deepspeed_whl.sh
. benchmarks/machine_info.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
RAW=${RAW:-/tmp/graphed_runtime}
mkdir -p "$RAW" "$OUT"
machine_info "$RAW"
timeout "${LIMIT:-540}" $PY benchmarks/graphed_runtime.py run --out "$RAW" "$@" 2>&1 | tee "$RAW/run.log"
status=${PIPESTATUS[0]}
nvidia-smi -q -d PERFORMANCE > "$RAW/nvidia-smi-after.txt"
tar czf "$OUT/graphed_runtime.tar.gz" -C "$RAW" .
exit $status

#!/usr/bin/env bash
# One call of benchmarks/graphed_runtime.py on a lent GPU, with what its results file says of the machine:
# OUT/raw/{machine.txt, nvidia-smi-q.txt (before), nvidia-smi-after.txt (clock event counters after), run.log}
# beside the runs. NEVER changes clocks or power limits. DeepSpeed missing (the lent machines): the wheels in
# .whl/ are unpacked first (deepspeed_whl.sh). COMMIT names the code (a carried copy has no git history).
#
#   OUT=/tmp/g COMMIT=abc1234 bash benchmarks/graphed_runtime_gpu.sh --deadline-s 470 CONFIG...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
PY=${PYTHON:-python3}
. benchmarks/deepspeed_whl.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT/raw"
{
  date
  uname -r
  echo "cpus: $(nproc)"
  uptime
  lscpu | grep 'Model name'
  echo "commit ${COMMIT:-unknown}"
  $PY -c 'from importlib.metadata import version as v; print(*(f"{n} {v(n)}" for n in ("torch", "deepspeed",
"transformers")))' 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.sm,clocks.max.sm,clocks.applications.graphics \
    --format=csv
} > "$OUT/raw/machine.txt"
nvidia-smi -q > "$OUT/raw/nvidia-smi-q.txt"
$PY benchmarks/graphed_runtime.py run --out "$OUT/raw" "$@" 2>&1 | tee "$OUT/raw/run.log"
status=${PIPESTATUS[0]}
nvidia-smi -q -d PERFORMANCE > "$OUT/raw/nvidia-smi-after.txt"
exit $status

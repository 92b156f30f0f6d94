# Sourced by the one-GPU benchmark scripts (search_accuracy_gpu.sh, graphed_runtime_gpu.sh) with $PY set:
# `machine_info DIR` writes what a results file says of the machine before the runs: DIR/machine.txt (date,
# kernel, CPUs, load, commit ${COMMIT}, package versions, the GPUs' clocks and limits) and DIR/nvidia-smi-q.txt.
machine_info() {
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
  } > "$1/machine.txt"
  nvidia-smi -q > "$1/nvidia-smi-q.txt"
}

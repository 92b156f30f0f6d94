#!/usr/bin/env bash
# Prediction accuracy of `envpipe search` (Aceso-style): measure the links, profile every layer, let the
# search predict every configuration of 2 GPUs (P in {1, 2}, several micro-batch sizes, the best cut, and
# for the fastest 2-stage shape cuts moved by SHIFT layers), train each one for real (examples/train_gpt.py's model and found config,
# EnvPipe runtime) and write predicted vs measured iteration time and peak memory per stage.
# NEVER changes clocks or power limits: without envpipe-clockd the runtime only records clock requests.
#
#   OUT=/tmp/sr bash benchmarks/search_h200.sh                  # 2 x H200: GPT-2 and Llama, bf16
#   MODELS=llama OUT=/tmp/sr bash benchmarks/search_h200.sh     # one model (8 runs of about 40 s each)
#   MODELS=gpt2 GPT2_ARGS="--model gpt2 --layers 28 --hidden 1024 --heads 16 --seq 512 --vocab 50304" ...  # another shape
#   MODELS= PROFILE_48=1 OUT=/tmp/sr bash benchmarks/search_h200.sh  # only the 48-layer GPT-2 XL profile
#   GRAPHS=1 ENGINE_MODEL=benchmarks/results/search_accuracy/call7/engine.json ...  # searched with --cuda-graphs
#       and that engine model, trained graphed (GPUs only: the search refuses a CPU profile graphed)
#   CPU=1 OUT=/tmp/sr bash benchmarks/search_h200.sh            # small models on 2 CPU processes (gloo, sim clock)
#   CPU=1 TINY=1 MODELS=gpt2 SIZES=2 SHIFT=0 ...                 # the tests' quick check of the script's logic
#   RETRAIN=earlier/search_runs.tar.gz NAMES="P1_D2_b8_cut38 ..." OUT=/tmp/sr bash benchmarks/search_h200.sh
#       an earlier call's configurations trained again (all, or NAMES) with this code: its links, layer profiles
#       and predictions as that call wrote them, nothing measured or searched again
#
# DEADLINE_S: no training run starts later than this many seconds after the script did (default: no limit).
#
# OUT gets few files (the device tool brings back at most 8): search_h200.md (the results), layers_<model>.json
# (the layer profiles), layers_gpt2_48.json (PROFILE_48=1, GPU only: a 48-layer GPT-2 XL profile for the
# search-cost benchmark), search_runs.tar.gz (everything else: configs, plans, run JSON, logs). Work files
# go to WORK.
# DeepSpeed missing (the lent machines): the wheels carried in .whl/ are unpacked first (deepspeed_whl.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-search-bench}
WORK=${WORK:-$(mktemp -d /tmp/search-bench.XXXXXX)}
PY=${PYTHON:-python3}
STEPS=${STEPS:-8}
SHIFT=${SHIFT:-2}
SEARCH_ARGS=()  # what both the search and search_configs.py are given
if [ "${GRAPHS:-0}" = 1 ]; then SEARCH_ARGS+=(--cuda-graphs); fi
if [ -n "${ENGINE_MODEL:-}" ]; then SEARCH_ARGS+=(--engine-model "$ENGINE_MODEL"); fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
declare -A ARGS
if [ "${CPU:-0}" = 1 ]; then
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  MODELS=${MODELS-"gpt2 llama"}
  ARGS[gpt2]="--model gpt2 --layers 6 --hidden 256 --heads 4 --seq 128 --vocab 2048"
  ARGS[llama]="--model llama --layers 6 --hidden 256 --heads 4 --seq 128 --vocab 2048"
  if [ "${TINY:-0}" = 1 ]; then ARGS[gpt2]="--tiny"; ARGS[llama]="--tiny --model llama"; fi
  SIZES=${SIZES:-1,2,4}; BATCH=${BATCH:-16}; MEMORY_GIB=${MEMORY_GIB:-4}
  COMMS_ARGS="--tiny"
else
  unset ENVPIPE_CLOCKD_SOCKET 2>/dev/null || true
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off
  MODELS=${MODELS-"gpt2 llama"}
  ARGS[gpt2]=${GPT2_ARGS:-"--model gpt2 --layers 16 --hidden 2048 --heads 16 --seq 1024 --vocab 50304"}
  ARGS[llama]=${LLAMA_ARGS:-"--model llama --layers 16 --hidden 2048 --heads 16 --seq 1024 --vocab 32000"}
  SIZES=${SIZES:-2,4,8}; BATCH=${BATCH:-32}; MEMORY_GIB=${MEMORY_GIB:-130}
  COMMS_ARGS="--model gpt2 --layers 2 --hidden 256 --heads 4 --seq 128 --vocab 2048"
fi
mkdir -p "$OUT" "$WORK"
source benchmarks/deepspeed_whl.sh
{ date -u; uname -srm; echo "cpus: $(nproc --all)"; uptime
  if [ "${CPU:-0}" != 1 ]; then
    nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv
  fi
  $PY -c 'import torch, deepspeed, transformers; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "transformers", transformers.__version__)'
} > "$WORK/machine.txt" 2>&1
torchrun() { $PY -m torch.distributed.run --standalone --nproc-per-node "$1" "${@:2}"; }
FAILED=0
train() {  # train MODEL_DIR NAME [PROCESSES]: one found configuration, trained by the EnvPipe runtime (2 processes)
  local dir=$1 name=$2 procs=${3:-2}
  if [ -n "${DEADLINE_S:-}" ] && [ "$SECONDS" -ge "$DEADLINE_S" ]; then
    echo "$(date -u +%T) $(basename "$dir"): $name not trained (past DEADLINE_S=$DEADLINE_S)"; return
  fi
  echo "$(date -u +%T) $(basename "$dir"): train $name"
  mkdir -p "$dir/runs"
  if ! torchrun "$procs" benchmarks/search_run.py --out "$dir/runs/$name.json" -- --config "$dir/configs/$name.json" \
      --steps "$STEPS" --calibration-steps 2 --report-dir "$dir/report_$name" > "$dir/runs/$name.log" 2>&1; then
    echo "exit status $?, log runs/$name.log" > "$dir/runs/$name.failed"; tail -20 "$dir/runs/$name.log"; FAILED=1
  fi
}
render() {  # render COMMAND: the results and the work directory into OUT
  $PY benchmarks/search_results.py two-gpu "$WORK" --command "$1" > "$OUT/search_h200.md"
  tar -czf "$OUT/search_runs.tar.gz" -C "$WORK" .
  echo "$(date -u +%T) results: $OUT/search_h200.md"
}

if [ -n "${RETRAIN:-}" ]; then
  tar -xzf "$RETRAIN" -C "$WORK" --wildcards ./links.json './*/layers.json' './*/configs/*'
  for dir in "$WORK"/*/; do
    dir=${dir%/}
    for name in ${NAMES:-$(cat "$dir/configs/configs.txt")}; do
      if [ -f "$dir/configs/$name.json" ]; then train "$dir" "$name"; fi
    done
  done
  render "RETRAIN=$RETRAIN${NAMES:+ NAMES=\"$NAMES\"} STEPS=$STEPS${CPU:+ CPU=$CPU} bash benchmarks/search_h200.sh"
  exit $FAILED
fi

echo "$(date -u +%T) links"
torchrun 2 benchmarks/search_links.py --out "$WORK/links.json" > "$WORK/links.log" 2>&1 || { tail -30 "$WORK/links.log"; exit 1; }
echo "$(date -u +%T) communicators: a tiny model in each layout (1 x 1, 2 x 1, 1 x 2)"
comms="$WORK/communicators"
mkdir -p "$comms"
if $PY examples/train_gpt.py $COMMS_ARGS --profile-layers "$comms/layers.json" --profile-micro-batches 1 \
    > "$comms/profile.log" 2>&1; then
  for gpus in 1 2; do
    $PY benchmarks/search_configs.py --layers "$comms/layers.json" --gpus $gpus --global-batch 2 --memory-gib "$MEMORY_GIB" \
      --links "$WORK/links.json" --shift 0 --out "$comms/configs" > "$comms/configs$gpus.log"
    for name in $(cat "$comms/configs/configs.txt"); do train "$comms" "$name" "$gpus"; done
  done
  $PY benchmarks/search_comms.py "$comms/runs" --links "$WORK/links.json" || echo "communicators not measured"
else
  tail -20 "$comms/profile.log"; echo "communicators not measured"
fi
LINKS=$($PY -c 'import json, sys; from benchmarks.search_links import search_options
print(search_options(json.load(open(sys.argv[1]))))' "$WORK/links.json")
for model in $MODELS; do
  dir="$WORK/$model"
  mkdir -p "$dir"
  echo "$(date -u +%T) $model: profile layers"
  # shellcheck disable=SC2086
  $PY examples/train_gpt.py ${ARGS[$model]} --profile-layers "$dir/layers.json" --profile-micro-batches "$SIZES" \
    > "$dir/profile.log" 2>&1 || { tail -30 "$dir/profile.log"; exit 1; }
  cp "$dir/layers.json" "$OUT/layers_$model.json"
  echo "$(date -u +%T) $model: search"
  # shellcheck disable=SC2086
  $PY -c 'import sys; from envpipe.cli import main; sys.exit(main())' search --layers "$dir/layers.json" \
    --gpus-per-node 2 --global-batch "$BATCH" --memory-gib "$MEMORY_GIB" $LINKS --top-k 10 "${SEARCH_ARGS[@]}" --out-dir "$dir/search" \
    > "$dir/search.log" 2>&1 || { tail -30 "$dir/search.log"; exit 1; }
  $PY benchmarks/search_configs.py --layers "$dir/layers.json" --gpus 2 --global-batch "$BATCH" \
    --memory-gib "$MEMORY_GIB" --links "$WORK/links.json" --shift "$SHIFT" "${SEARCH_ARGS[@]}" --out "$dir/configs" \
    | tee "$dir/configs.log"
  for name in $(cat "$dir/configs/configs.txt"); do train "$dir" "$name"; done
done
if [ "${CPU:-0}" != 1 ] && [ "${PROFILE_48:-0}" = 1 ]; then
  echo "$(date -u +%T) 48-layer GPT-2 XL profile (for the search-cost benchmark)"
  $PY examples/train_gpt.py --model gpt2 --layers 48 --hidden 1600 --heads 25 --seq 1024 --vocab 50304 \
    --profile-layers "$OUT/layers_gpt2_48.json" --profile-micro-batches 1,2,4,8 > "$WORK/profile48.log" 2>&1 || tail -20 "$WORK/profile48.log"
fi
cmd="${GPT2_ARGS:+GPT2_ARGS=\"$GPT2_ARGS\" }${LLAMA_ARGS:+LLAMA_ARGS=\"$LLAMA_ARGS\" }MODELS=\"$MODELS\" SIZES=$SIZES BATCH=$BATCH STEPS=$STEPS SHIFT=$SHIFT${CPU:+ CPU=$CPU}${GRAPHS:+ GRAPHS=$GRAPHS}${ENGINE_MODEL:+ ENGINE_MODEL=$ENGINE_MODEL} bash benchmarks/search_h200.sh"
render "$cmd"
exit $FAILED

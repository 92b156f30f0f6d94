# Sourced by the GPU benchmark scripts (benchmarks/runtime_h200.sh, benchmarks/dp_h200.sh) from the repository
# root with $PY set. DeepSpeed missing (the lent machines): the wheels carried in .whl/ (DeepSpeed and its small
# pure dependencies) are unpacked onto PYTHONPATH, exported to the runs that follow: no pip, no root.
if ! $PY -c 'import deepspeed' 2>/dev/null; then
  [ -d .whl ] || { echo "deepspeed is not installed and there is no .whl/ to unpack it from" >&2; exit 1; }
  mkdir -p .whl/site
  for w in .whl/*.whl; do $PY -m zipfile -e "$w" .whl/site; done
  export PYTHONPATH="$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}"
  $PY -c 'import deepspeed' || { echo "deepspeed still not importable from .whl/site" >&2; exit 1; }
fi

# EnvPipe toolkit. `make demo` and `make test` set themselves up on a fresh machine.
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PROFILE ?= envpipe/profile/data/gpt3-175b+a100_sxm_bf16.csv
OUTDIR  ?= out

.PHONY: install demo demo-plan test test-deps lint clean e2e

install: $(STAMP)

# torch is pinned to the CPU build that lies on disk (plain `torch` would pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) (one time, about 2 minutes)"
	$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@echo "make: installing torch 2.13.0 (the CPU build)"
	@$(PY) -m pip install -q torch==2.13.0
	@echo "make: installing envpipe with every extra (DeepSpeed, the planner, the launcher, clockd, test tools)"
	@$(PY) -m pip install -q -e '.[all,test]'
	@touch $@
	@echo "make: $(VENV) is ready; its commands are in $(VENV)/bin (or: source $(VENV)/bin/activate)"

# The main job on the embedded default: no GPU, no cluster. Two CPU processes (gloo) train a small
# GPT-2 on DeepSpeed's pipeline engine (envpipe.initialize in an ordinary loop) with simulated clocks and the
# runtime's default policy (optimal): calibrate, profile, plan, reconfigure from measured iterations, steady
# state (the plan interleaved with 1F1B all-max iterations); one progress line per iteration, then the report.
DEMO_ARGS ?= --layers 4 --hidden 192 --heads 4 --seq 96 --vocab 512 --micro-batch 4 --microbatches 8 \
	--steps 30 --compare-iterations 4 --log-interval 1
demo: $(STAMP)
	@mkdir -p $(OUTDIR)
	@echo "make demo: GPT-2 split into 2 pipeline stages on 2 CPU processes, simulated GPU clocks (about a minute)"
	@echo "           rank 0's progress below; every rank's output in $(OUTDIR)/demo.log"
	@set -o pipefail; DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --standalone \
	  --nproc-per-node 2 examples/train_gpt.py $(DEMO_ARGS) --report-dir $(OUTDIR)/runtime 2>&1 \
	  | tee $(OUTDIR)/demo.log | grep --line-buffered -E '^\[envpipe\]|^envpipe: ' \
	  || { echo "make demo failed:" >&2; grep -hE 'train_gpt.py: error:' $(OUTDIR)/demo.log | sort -u >&2 \
	       || tail -5 $(OUTDIR)/demo.log >&2; echo "(full log: $(OUTDIR)/demo.log)" >&2; exit 1; }
	@echo
	@cat $(OUTDIR)/runtime/report.txt

# The planner alone on a real measured profile (8-stage GPT-3 on A100s): plan, text trace, Gantt, re-simulation.
demo-plan: $(STAMP)
	mkdir -p $(OUTDIR)
	$(VENV)/bin/envpipe plan --profile $(PROFILE) --microbatches 12 --schedule envpipe \
	  --policy envelope --reconfig balanced --idle-power 83.64 --gpu a100 \
	  --out $(OUTDIR)/plan.json --text --gantt $(OUTDIR)/gantt.png
	$(VENV)/bin/envpipe simulate --profile $(PROFILE) --plan $(OUTDIR)/plan.json --idle-power 83.64

# pytest exits 5 when it collects nothing; that is not a failure of the code under test.
test: $(STAMP) test-deps
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# The real ssh/pdsh and container tests need system packages (.ci/apt-deps): installed here as root,
# else one line says how (those tests skip themselves, each with its reason, without them).
test-deps:
	@if [ "$$(id -u)" = 0 ]; then .ci/apt-deps; \
	 else echo "make: not root: the real ssh/pdsh/container tests need 'sudo .ci/apt-deps' first (they skip without)"; fi

# Real containers (tests/e2e, root): both images built with podman from a local Debian base, then
# clockd and two training containers on this host like one Kubernetes node, and a 2-node job across
# them. Needs podman, buildah, runc, debootstrap (.ci/apt-deps); skipped with one line where podman
# cannot run. ENVPIPE_E2E_KEEP=1 ENVPIPE_E2E_DIR=/var/tmp/e2e keeps the images for the next run;
# ENVPIPE_E2E_STORAGE=vfs where overlay is refused (about 4x slower).
e2e: $(STAMP)
	ENVPIPE_E2E=1 $(PY) -m pytest -q -rs -p no:cacheprovider tests/e2e

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy envpipe examples

clean:
	rm -rf $(VENV) $(OUTDIR) .pytest_cache .ruff_cache .mypy_cache

-include images/images.mk

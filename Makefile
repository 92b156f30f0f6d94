# EnvPipe toolkit. `make demo` and `make test` set themselves up on a fresh machine.
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
# Every install goes through uv (parallel downloads, one resolve, several times faster than pip on 2 cores),
# which the venv's own pip brings from PyPI. Bytecode is compiled at install, as pip does: the demo's and the
# tests' many processes then never compile torch again (nor on every start where PYTHONDONTWRITEBYTECODE is set).
UV_VERSION := 0.13.9
UV_BIN  := $(VENV)/bin/uv
UV      := $(UV_BIN) pip install --python $(PY) --quiet --compile-bytecode
# torch's CPU build, never PyPI's CUDA one (a CUDA wheel cannot satisfy +cpu). uv reads no pip configuration:
# where pip is told of a wheel folder (find-links; this project's machines keep the CPU wheel in one) uv
# looks there, else in PyTorch's CPU index. `make demo TORCH_FROM='--index-url URL'` picks another source.
TORCH   := torch==2.13.0+cpu
# (pip is asked once, and only by the targets that install torch)
PIP_WHEELS = $(eval PIP_WHEELS := $$(shell $(PYTHON) -m pip config list 2>/dev/null \
  | sed -n "s/^[^=]*\.find-links='\(..*\)'$$$$/\1/p" | head -1))$(PIP_WHEELS)
TORCH_FROM ?= $(if $(PIP_WHEELS),$(addprefix --find-links ,$(PIP_WHEELS)),--index-url https://download.pytorch.org/whl/cpu)
# DeepSpeed builds its CPU op (torch.utils.cpp_extension) under TORCH_EXTENSIONS_DIR, by default one folder in
# ~/.cache shared by every checkout and venv on the machine: each rebuilds the other's op (5 minutes without a
# word at load 14) and a killed build's lock file stalls all of them. Here it is this venv's own folder: the
# demo and test targets say so, and a .pth file in the venv sets it for every Python the venv starts (a user's
# script run through envpipe-launch or torchrun included) unless it is set already.
EXT_DIR := $(abspath $(VENV))/torch_extensions
export TORCH_EXTENSIONS_DIR ?= $(EXT_DIR)
EXT_PTH = import os, sys; os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
DEMO_STAMP := $(VENV)/.installed-demo
STAMP   := $(VENV)/.installed
PROFILE ?= envpipe/profile/data/gpt3-175b+a100_sxm_bf16.csv
OUTDIR  ?= out
, := ,

.PHONY: install demo-install demo demo-plan test test-slow test-all test-deps lint clean e2e

# $(call step,WHAT,COMMAND): one progress line, "make: WHAT ... 12.3 s"; the command's own output is
# shown only when it fails (its last 40 lines).
define step
@t0=$${EPOCHREALTIME/./}; printf 'make: %s ... ' "$(1)"; \
if out=$$( { $(2); } 2>&1 ); then t=$$(( ($${EPOCHREALTIME/./} - t0) / 100000 )); echo "$$((t / 10)).$$((t % 10)) s"; \
else rc=$$?; echo "failed:" >&2; tail -n 40 <<<"$$out" >&2; exit $$rc; fi
endef

# The venv, and uv in it from PyPI by the venv's own pip (which stays: the tests build wheels with it). uv is
# pinned so that every machine installs alike.
$(UV_BIN):
	$(call step,python venv $(VENV) with uv $(UV_VERSION),$(PYTHON) -m venv $(VENV) \
	  && $(PY) -m pip install --disable-pip-version-check -q uv==$(UV_VERSION))

# What `make demo` needs and nothing more: DeepSpeed, torch, transformers and the planner (no test tools).
# (uv order-only: a venv whose packages are current is not reinstalled for it; one without uv gets it.)
demo-install: $(DEMO_STAMP)
$(DEMO_STAMP): pyproject.toml | $(UV_BIN)
	$(call step,torch 2.13.0$(,) the CPU build (from $(filter-out --%,$(TORCH_FROM))),$(UV) $(TORCH_FROM) '$(TORCH)')
	$(call step,envpipe[train]: DeepSpeed$(,) transformers$(,) the planner,$(UV) -e '.[train]')
	@touch $@

# the venv's .pth file (see EXT_DIR); a venv made before it gets it on the next demo or test
EXT_STAMP := $(VENV)/.torch-extensions-dir
$(EXT_STAMP): | $(UV_BIN)
	@echo '$(EXT_PTH)' > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/envpipe_torch_extensions.pth"
	@touch $@

# Everything: every extra (the launcher, clockd, TensorBoard) and the test tools, on top of the demo's.
install: $(STAMP) $(EXT_STAMP)
$(STAMP): $(DEMO_STAMP)
	$(call step,envpipe[all$(,)test]: launcher$(,) clockd$(,) test tools,$(UV) -e '.[all$(,)test]')
	@touch $@
	@echo "make: $(VENV) is ready; its commands are in $(VENV)/bin (or: source $(VENV)/bin/activate)"

# The main job on the embedded default: no GPU, no cluster. Two CPU processes (gloo) train a small
# GPT-2 on DeepSpeed's pipeline engine (envpipe.initialize in an ordinary loop) with simulated clocks and the
# runtime's default policy (optimal): calibrate, profile, plan, reconfigure from measured iterations, steady
# state (the plan interleaved with 1F1B all-max iterations); one progress line per iteration, then the report.
DEMO_ARGS ?= --layers 4 --hidden 192 --heads 4 --seq 96 --vocab 512 --micro-batch 4 --microbatches 8 \
	--steps 30 --compare-iterations 4 --log-interval 1
demo: $(DEMO_STAMP) $(EXT_STAMP)
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
demo-plan: $(DEMO_STAMP) $(EXT_STAMP)
	mkdir -p $(OUTDIR)
	$(VENV)/bin/envpipe plan --profile $(PROFILE) --microbatches 12 --schedule envpipe \
	  --policy envelope --reconfig balanced --idle-power 83.64 --gpu a100 \
	  --out $(OUTDIR)/plan.json --text --gantt $(OUTDIR)/gantt.png
	$(VENV)/bin/envpipe simulate --profile $(PROFILE) --plan $(OUTDIR)/plan.json --idle-power 83.64

# Two tiers (CONTRIBUTING.md): `make test` is the developer's (every part by a fast test, a few minutes);
# `make test-slow` runs the tests marked slow (real multi-process training, sshd, notebooks, fuzzing);
# `make test-all` both. pytest exits 5 when it collects nothing: not a failure of the code under test.
PYTEST = rc=0; $(PY) -m pytest -q -p no:cacheprovider --durations=15 $(1) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc
# The fast tier runs in TEST_WORKERS processes (pytest-xdist; `make test TEST_WORKERS=0` runs it in one), at most
# 4: its tests take no wall-clock bound, so they share the CPU safely. The slow tier's real-time tests run alone.
TEST_WORKERS ?= auto
test: $(STAMP) $(EXT_STAMP) test-deps
	@$(call PYTEST,-m "not slow" -n $(TEST_WORKERS) --maxprocesses 4)
test-slow: $(STAMP) $(EXT_STAMP) test-deps
	@$(call PYTEST,-m slow)
test-all: test test-slow

# The real ssh/pdsh and container tests need system packages (.ci/apt-deps): installed here as root,
# else one line says how (those tests skip themselves, each with its reason, without them).
test-deps:
	@if [ "$$(id -u)" = 0 ]; then .ci/apt-deps; \
	 else echo "make: not root: the real ssh/pdsh/container tests need 'sudo .ci/apt-deps' first (they skip without)"; fi

# Real containers (tests/e2e, root): both images built with podman from a local Debian base, then
# clockd and two training containers on this host like one Kubernetes node, and a 2-node job across
# them. Needs podman, buildah, runc, debootstrap (.ci/apt-deps, installed here as root); where podman
# cannot run, one line says why and it exits 0. One line per stage with its time (not pytest's dots).
# ENVPIPE_E2E_KEEP=1 ENVPIPE_E2E_DIR=/var/tmp/e2e keeps the images for the next run;
# ENVPIPE_E2E_STORAGE=vfs where overlay is refused (about 4x slower).
e2e: $(STAMP)
ifneq ($(shell id -u),0)
	@echo "make e2e: skipped: podman runs rootful here; run 'sudo make e2e'"
else
	$(call step,system packages (.ci/apt-deps),.ci/apt-deps)
	@why=$$($(PY) -m tests.e2e.podman); if [ -n "$$why" ]; then echo "make e2e: skipped: $$why"; exit 0; fi; \
	ENVPIPE_E2E=1 $(PY) -m pytest -q -rs -p no:cacheprovider tests/e2e
endif

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy envpipe examples launcher benchmarks

clean:
	rm -rf $(VENV) $(OUTDIR) .pytest_cache .ruff_cache .mypy_cache

-include images/images.mk

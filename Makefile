# The pip path: the pixi tasks of pixi.toml, target for target, for machines
# without conda (CI uses it). The first target that needs it creates .venv.
#
#   make tests                 every package's CPU tests and the integration tests (all run; failures named)
#   make wheels                the four packages' wheels in dist/ (pip install --find-links dist racing-stack)
#   make examples              every example of examples/, briefly on the CPU
#   make benchmark-rl-triton   the rl_triton benchmark (full report on a CUDA GPU)
#   make benchmark-racing-env  the racing_env M4 protocol (formal report on a CUDA GPU)
#   make benchmark-track-pool  the racing_env M5 TrackPool protocol (formal report on a CUDA GPU)
#   make benchmark-car-envelope  the car's envelope, measured in MuJoCo C (report on the CPU, minutes)
#   make benchmark-min-time-laps  a lap at the limit on every Validation and Test track (report on the CPU, minutes)
#   make benchmark-limits  the leaderboard: the shipped controllers and PPO's plugin over T_lim on 1,000 Test tracks
#   make benchmark-ppo         PPO on Level 1 Train, against pure pursuit on Validation and Test (report on a CUDA GPU)
#   make benchmark-ppo-integrity  PPO's zero-copy rollouts against a host-copy reference (report on a CUDA GPU)
#   make benchmark-ppo-speed   PPO's transitions/s against the env alone, and its time to skill (report on a CUDA GPU)
#   make benchmark-batched-eval  a learned controller on the Test tracks, batched against one episode at a time
#   make benchmark-faults  attacks on an evaluation: malicious plugins, kills, full disks (report on the CPU, minutes)

PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch, from PyTorch's CPU index on any Linux machine (a
# local wheel of it, where pip's configuration has one, is used as well).
# Another build: TORCH_INDEX=https://download.pytorch.org/whl/cu130; PyPI's
# default build: TORCH_INDEX= (empty).
TORCH ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# torch alone from that index (its dependencies then come from the usual ones), tried
# twice: offline, pip falls back on a local wheel without five retries' wait.
TORCH_PIP := --no-deps --retries 1 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
PACKAGES := rl_triton track_gen racing_env racing_stack
PY := $(abspath $(VENV))/bin/python
# The tests run in TEST_WORKERS processes (pytest-xdist), each test file in one of them (its
# module fixtures built once); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
PYTEST := -m pytest -q -n $(TEST_WORKERS) --dist loadfile
STAMP := $(VENV)/.installed
DEV := "ruff>=0.6" "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" "matplotlib>=3.8" box2d==2.3.10 "pygame>=2.5" "pillow>=10" "imageio-ffmpeg>=0.5" "tensorboardX>=2.6" "mkdocs-material>=9.5" "mkdocstrings[python]>=0.26"

.DEFAULT_GOAL := help

.PHONY: help lint tests gpu-tests test-rl-triton test-track-gen test-racing-env test-racing-stack \
        test-integration examples sim materialize-track-pool evaluate train-ppo docs wheels benchmark-rl-triton benchmark-track-gen benchmark-racing-env benchmark-track-pool benchmark-ppo benchmark-ppo-integrity benchmark-ppo-speed benchmark-batched-eval benchmark-faults matrix clean
.PHONY: benchmark-car-envelope benchmark-min-time-laps benchmark-limits

# `make` or `make help`: every target with its line (the `##` comments).
help:
	@echo "make TARGET [ARGS=\"...\"]   (the pip path: the first target that needs it creates .venv)"
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/  \1|\2/' | \
		awk -F'|' '{printf "  %-24s %s\n", $$1, $$2}'

# Silent, its news on stderr: the first `make sim > run.json` still writes only JSON.
$(STAMP): $(foreach p,$(PACKAGES),packages/$(p)/pyproject.toml) Makefile
	@echo "make: installing the packages into $(VENV) ($(TORCH), the dev tools, the four packages editable)" >&2
	@$(PYTHON) -m venv $(VENV) >&2
	@$(PY) -m pip install -q $(TORCH_PIP) "$(TORCH)" >&2
	@$(PY) -m pip install -q "$(TORCH)" $(DEV) \
		$(foreach p,$(PACKAGES),-e packages/$(p)) >&2
	@touch $@

# Every package's target runs even when one fails (a failure in one package
# hides nothing of the others); the failed ones are named at the end.
TEST_TARGETS := test-rl-triton test-track-gen test-racing-env test-racing-stack test-integration

tests: $(STAMP) ## every package's CPU tests, then the integration tests; names the targets that failed
	@failed=""; for target in $(TEST_TARGETS); do \
		$(MAKE) --no-print-directory $$target || failed="$$failed $$target"; \
	done; \
	if [ -n "$$failed" ]; then echo "make tests: FAILED:$$failed" >&2; exit 1; fi; \
	echo "make tests: every target passed ($(TEST_TARGETS))"

test-rl-triton: $(STAMP) ## rl_triton's tests (its kernels under TRITON_INTERPRET=1)
	cd packages/rl_triton && $(PY) $(PYTEST) -m 'not kernels and not gpu' \
		&& TRITON_INTERPRET=1 $(PY) $(PYTEST) -m kernels

test-track-gen: $(STAMP) ## track_gen's CPU tests
	cd packages/track_gen && $(PY) $(PYTEST) -m 'not gpu'

test-racing-env: $(STAMP) ## racing_env's CPU tests (both backends)
	cd packages/racing_env && $(PY) $(PYTEST) -m 'not gpu'

test-racing-stack: $(STAMP) ## racing_stack's CPU tests
	cd packages/racing_stack && $(PY) $(PYTEST) -m 'not gpu'

test-integration: $(STAMP) ## the tests across packages (tests-integration/)
	$(PY) $(PYTEST) tests-integration

gpu-tests: $(STAMP) ## the CUDA tests (on a GPU machine)
	$(PY) -m pytest -q packages/rl_triton/tests -m 'kernels or gpu' \
		&& $(PY) -m pytest -q packages/track_gen/tests -m gpu \
		&& $(PY) -m pytest -q packages/racing_env/tests -m gpu \
		&& $(PY) -m pytest -q packages/racing_stack/tests -m gpu

# One episode of a controller on track seed 42 (ARGS="--backend mjx_warp", ...).
# Silent (@): stdout is the JSON alone, so `make sim > run.json` is valid JSON.
sim: $(STAMP) ## one episode on track_gen seed 42, printed as JSON
	@$(PY) -m racing_stack.sim $(ARGS)

# Every example of examples/, briefly, on the CPU; each prints where it wrote (examples/out/).
examples: $(STAMP) ## every example, briefly on the CPU (pictures in examples/out/)
	$(PY) examples/track_gen_drive.py --steps 40 --envs 2
	$(PY) examples/track_gen_pictures.py --num-envs 64
	$(PY) examples/racing_env_trajectories.py --seconds 5

# Level 1's Train, Validation and Test pools into the cache, verified (ARGS="--splits validation", ...).
materialize-track-pool: $(STAMP) ## Level 1's pools into the cache, verified
	$(PY) -m racing_stack.pools $(ARGS)

# A controller plugin on a Level's tracks, as JSON and a picture (ARGS="--tracks 10 --plot run.png", ...).
# Silent (@), as sim: stdout is the JSON summary alone.
evaluate: $(STAMP) ## a controller plugin on a Level's tracks
	@$(PY) -m racing_stack.evaluate $(ARGS)

# PPO on Level 1's Train pool, exported as a plugin (ARGS="--preset gpu", "--resume", ...).
train-ppo: $(STAMP) ## PPO on the Train pool, exported as a plugin
	$(PY) -m racing_stack.ppo $(ARGS)

lint: $(STAMP) ## ruff over the whole repository (ruff.toml)
	$(PY) -m ruff check .

docs: $(STAMP) ## the docs site (site/; mkdocs-material's end-of-life notice kept off)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

benchmark-rl-triton: $(STAMP) ## the rl_triton benchmark
	$(PY) benchmarks/rl_triton/bench_scans.py

benchmark-track-gen: $(STAMP) ## the track_gen benchmarks
	$(PY) benchmarks/track_gen/generate.py && $(PY) benchmarks/track_gen/step.py

benchmark-racing-env: $(STAMP) ## the M4 environment protocol
	$(PY) benchmarks/racing_env/m4_environment.py

benchmark-track-pool: $(STAMP) ## the M5 TrackPool protocol
	$(PY) benchmarks/racing_env/m5_track_pool.py

# ARGS="--short" for the tests' schedule (seconds), "--publish" for the committed report.
benchmark-car-envelope: $(STAMP) ## the car's envelope (lateral, forward, braking, g-g), measured
	$(PY) benchmarks/racing_env/car_envelope.py $(ARGS)

# ARGS="--check" recomputes and compares with the committed report; "--tracks 20" a quick prefix;
# "--publish" writes the committed report.
benchmark-min-time-laps: $(STAMP) ## T_lim, a lap at the limit, on every Validation and Test track
	$(PY) benchmarks/racing_env/min_time_laps.py $(ARGS)

# ARGS="--tracks 20" a quick prefix; "--backend mjx_warp --worlds 64" on a GPU machine; "--publish" for the
# committed report.
benchmark-limits: $(STAMP) ## the leaderboard: each controller's laps over T_lim on the Test tracks
	$(PY) benchmarks/racing_env/limits.py $(ARGS)

# ARGS="--dev" for an experiment (no Test), "--seed 1", "--publish" for the committed report.
benchmark-ppo: $(STAMP) ## PPO trained and evaluated against the reference
	$(PY) benchmarks/racing_stack/ppo_level1.py $(ARGS)

benchmark-ppo-integrity: $(STAMP) ## PPO's zero-copy rollouts checked against a host-copy reference
	$(PY) benchmarks/racing_stack/ppo_integrity.py $(ARGS)

benchmark-batched-eval: $(STAMP) ## a learned controller on the Test tracks, batched against one episode at a time
	$(PY) benchmarks/racing_stack/batched_eval.py $(ARGS)

benchmark-faults: $(STAMP) ## attacks on an evaluation: malicious isolated plugins, kills of the evaluator, odd outputs
	$(PY) benchmarks/racing_stack/faults.py $(ARGS)

# ARGS="--profile" adds Torch's profile of each variant, "--publish" writes the committed report.
benchmark-ppo-speed: $(STAMP) ## PPO's transitions/s against the env's own, and its time to skill
	$(PY) benchmarks/racing_stack/ppo_speed.py $(ARGS)

# The four packages' wheels (pure Python), built from the checkout into dist/:
# `pip install --find-links dist racing-stack` installs racing-stack with the
# exact siblings it pins (torch first, as below, for its CPU build).
wheels: $(STAMP) ## the four packages' wheels in dist/ (pip install --find-links dist racing-stack)
	rm -rf dist $(addsuffix /build,$(addprefix packages/,$(PACKAGES)))  # setuptools would reuse a stale build/lib
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist $(addprefix ./packages/,$(PACKAGES))
	@ls dist

# Each package installed alone from its wheel (make wheels) in its own
# environment, with its own tests: proves that its pyproject.toml declares
# everything it needs, and its wheel everything it ships (racing-stack
# brings its pinned siblings from dist/ as a user's pip would). Each
# environment (2-4 GB) is removed once its tests pass, so a run holds one.
matrix: wheels ## each package installed alone from its wheel, with its own tests
	@set -e; for p in $(PACKAGES); do \
		env=$(abspath .venv-matrix)/$$p; rm -rf $$env; $(PYTHON) -m venv $$env; \
		deps="$$(ls $(abspath dist)/$$p-*.whl)[test]"; \
		if [ $$p = rl_triton ] || [ $$p = racing_stack ]; then deps="$$deps $(TORCH)"; fi; \
		echo "== $$p alone: pip install --find-links dist $$deps"; \
		case "$$deps" in *torch*) $$env/bin/python -m pip install -q $(TORCH_PIP) "$(TORCH)";; esac; \
		$$env/bin/python -m pip install -q --find-links $(abspath dist) $$deps; \
		if [ $$p = rl_triton ]; then \
			(cd packages/$$p && $$env/bin/python $(PYTEST) -m 'not kernels and not gpu' \
				&& TRITON_INTERPRET=1 $$env/bin/python $(PYTEST) -m kernels); \
		else \
			(cd packages/$$p && $$env/bin/python $(PYTEST) -m 'not gpu'); \
		fi; \
		rm -rf $$env; \
	done

clean: ## remove .venv, .venv-matrix and site
	rm -rf $(VENV) .venv-matrix site

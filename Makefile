# The two commands: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hasten-installed
# The demo's own light install: torch, hasten, tqdm (its progress bar) and matplotlib (`hasten plot`).
DEMO_STAMP := $(VENV)/.hasten-demo-installed
# torch first, pinned: on this kind of machine 2.13.0 is a local CPU wheel, so no CUDA build is pulled.
# Elsewhere: make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" ...
TORCH_SPEC ?= torch==2.13.0
DEMO_DIR ?= demo_out

.PHONY: demo demo-install test test-ecosystem test-clusters test-matrix lint typecheck layers pytest bench clean install conformance docs

install: $(STAMP)

# hasten becomes the venv's `accelerate` (hasten accelerate install) before the libraries that
# require one come in (the ecosystem extra: trl, peft): pip keeps the alias for them
# (docs/accelerate-compat.md, tests/ecosystem).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev,test,docs]"
	$(BIN)/hasten accelerate install
	$(BIN)/python -m pip install -q -e ".[ecosystem]"
	@touch $(STAMP)

# `make demo` needs only torch, hasten, tqdm and matplotlib: it installs those (torch first, pinned, so
# no CUDA build is pulled), not the test, docs or ecosystem tools, and leaves `accelerate` alone.
# A venv that `make test` set up already has all of them.
demo-install: $(DEMO_STAMP)

$(DEMO_STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -f $(STAMP) ]; then touch $(DEMO_STAMP); else \
		$(BIN)/python -m pip install -q $(TORCH_SPEC) && \
		$(BIN)/python -m pip install -q -e ".[plot,tqdm]" && touch $(DEMO_STAMP); fi

demo: $(DEMO_STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/hasten launch --cpu --num_processes 2 examples/train_classifier.py --project_dir $(DEMO_DIR)
	$(BIN)/hasten plot $(DEMO_DIR) -o $(DEMO_DIR)/metrics.png

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples docs conformance
	$(BIN)/ruff format --check src tests benchmarks examples docs conformance

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

# DeepSpeed JIT-builds its shared-memory comm op once (~80 s); build it into the venv (where
# tests/conftest.py points TORCH_EXTENSIONS_DIR) before the DeepSpeed tests need it, with the venv's
# ninja first on PATH as in tests/conftest.py (another ninja version would rebuild it).
DS_OPS := $(VENV)/.deepspeed-ops-built
$(DS_OPS): $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions $(BIN)/python -c \
		"from deepspeed.comm.torch import build_shm_op; build_shm_op()"
	@touch $(DS_OPS)

pytest: $(STAMP) $(DS_OPS)
	$(BIN)/python -m pytest -q --durations=25

# mypy (~1 min cold) and the DeepSpeed op build (~80 s) are each one core's work: run the checks
# and the build side by side, then the tests (a failed check still stops before pytest).
test: $(STAMP)
	@$(MAKE) --no-print-directory -j3 lint typecheck layers docs $(DS_OPS)
	@HASTEN_DOCS_SITE=$(abspath docs/_build/html) $(MAKE) --no-print-directory pytest

# The heavy engine x world-size resume rows (make test runs a sample of them).
test-matrix: $(STAMP) $(DS_OPS)
	$(BIN)/python -m pytest -q -m matrix tests/distributed/test_deepspeed_reshard.py

# The heavy rows of the Hugging Face ecosystem on hasten-as-accelerate (tests marked `ecosystem`,
# which `make test` leaves out): Trainer on 2 processes under DDP, FSDP2 and DeepSpeed ZeRO-2/3,
# trl, peft, diffusers' example script, and the alias's real uninstall/replace round trip.
test-ecosystem: $(STAMP) $(DS_OPS)
	$(BIN)/python -m pytest -q -m ecosystem tests/ecosystem

# The heavy cluster tests (the `clusters` marker), not in `make test`: Ray Train end to end
# (TorchTrainer, 2 CPU workers; a fit takes tens of seconds here) and two simulated machines
# under `hasten launch`. Installs the ray extra on first use.
RAY := $(VENV)/.ray-installed
$(RAY): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[ray]"
	@touch $(RAY)

test-clusters: $(RAY)
	$(BIN)/python -m pytest -q -m clusters --durations=0 tests/distributed/test_ray_train.py tests/cli/test_cluster_launch.py

# The documentation site, strictly (a warning fails the build), from scratch (-E: an incremental
# build would not repeat the warnings of unchanged pages). Open docs/_build/html/index.html.
# `make test` builds it beside the checks and tests/docs/test_site.py reads it
# (HASTEN_DOCS_SITE); pytest alone builds its own.
docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -E -q -b html docs docs/_build/html

# Accelerate 1.15's own test suite against hasten (docs/conformance.md): downloads the release
# archive into ~/.cache/hasten-conformance, runs each test file, compares the failures with
# conformance/known_differences.txt. Not part of `make test` (its own ~10 min); CI runs both.
CONFORMANCE_STAMP := $(VENV)/.conformance-installed
$(CONFORMANCE_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[conformance]"
	@touch $(CONFORMANCE_STAMP)

conformance: $(CONFORMANCE_STAMP) $(DS_OPS)
	$(BIN)/python conformance/run.py

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache docs/_build docs/api

# Two commands a user needs (README): `make demo` and `make test`.
# Everything is installed into ./.venv from pyproject.toml, pinned by constraints.txt.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Test processes: most slow tests wait on a Prefect or MLflow server, a subprocess or a browser, so two
# workers on 2 cores ran the suite 1.55x faster (1670 s -> 1075 s, same machine, same hour).
TEST_WORKERS ?= 2

.PHONY: setup demo test gpu-check lint docs doc-figures wheel browser constraints clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24" 
	$(BIN)/python -m pip install --quiet --progress-bar off -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

setup: $(STAMP)  ## create .venv and install uedp with pinned dependencies

demo: $(STAMP)  ## install, then run the end-to-end demo (ingest, detect, train, evaluate, log to MLflow)
	$(BIN)/uedp demo

# mypy (about a minute cold, as on a fresh clone) checks while the tests run: most slow tests wait on servers,
# subprocesses and a browser, so the two share the cores' idle time. Its report follows the tests'; either
# failing fails `make test`.
test: $(STAMP) browser  ## install, lint, then the whole test suite (TEST_WORKERS processes) with the type check beside it
	$(BIN)/ruff check .
	@$(BIN)/python scripts/typecheck.py > $(VENV)/typecheck.log 2>&1 & checking=$$!; \
	trap 'kill $$checking 2>/dev/null' INT TERM; \
	echo "$(BIN)/python scripts/typecheck.py (beside the tests; its report follows them)"; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not cuda" --durations=15; tests=$$?; \
	wait $$checking; types=$$?; \
	echo "$(BIN)/python scripts/typecheck.py:"; cat $(VENV)/typecheck.log; \
	test $$tests -eq 0 && test $$types -eq 0

# The GPU's own checks, never part of `make test` or CI: the CUDA-marked tests (device-side secret noise, bf16
# clipping, private runs on CUDA), then training throughput at real sizes, full and LoRA, with the settings of
# the README's CPU table (docs/guide.md, "Speed and threads").
GPU_MODELS ?= gpt2:25m,gpt2:100m,gpt2:100m+lora8,llama:100m,llama:100m+lora8
gpu-check: $(STAMP)  ## on a machine with a CUDA GPU: the cuda tests, then the throughput table at real sizes
	$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check needs a CUDA GPU (torch sees none)')"
	$(BIN)/python -c "import torch; print('device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
	$(BIN)/python -m pytest -m cuda -p no:cacheprovider -q tests/test_cuda.py
	$(BIN)/python benchmarks/train_throughput.py --device cuda --models $(GPU_MODELS) --batch-size 32 --steps 20 --rounds 2 --q-user 0.1 --local-steps 2 --repeats 3

lint: $(STAMP)  ## ruff, and mypy on the installed layout of the package (strict on the privacy core)
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py

docs: $(STAMP)  ## regenerate docs/cli.md from the CLI
	$(BIN)/python scripts/cli_reference.py

doc-figures: $(STAMP)  ## run `uedp demo` in a fresh data home and re-render the pages' demo table and timings
	$(BIN)/python scripts/doc_figures.py $(DOC_FIGURES_FLAGS)

wheel: $(STAMP)  ## build dist/uedp-*.whl (one import package, `uedp`; install it with -c constraints.txt)
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .

browser:  ## Debian's chromium, for the end-to-end UI test (installed when missing; needs root or sudo)
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

constraints:  ## re-pin after editing pyproject.toml: resolve in a scratch venv and freeze
	rm -rf /tmp/uedp-pin && $(PYTHON) -m venv /tmp/uedp-pin
	/tmp/uedp-pin/bin/pip install --quiet -e ".[dev]"
	{ sed -n '1,3p' constraints.txt; /tmp/uedp-pin/bin/pip freeze --exclude-editable \
	  | sed -e 's/^torch==\([0-9.]*\)+cpu/torch==\1/' | grep -v -E '^(pip|setuptools|wheel)=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) .uedp

# sd-webui-tome developer tasks. Everything runs on the CPU, offline after `make venv`.
#   make venv    create/refresh .venv (incremental: only re-runs when a requirements file changes)
#   make test    ruff check + ruff format --check + pytest (all but live-WebUI/ComfyUI tests; browser tests skip without chromium)
#   make bench   python -m tome_bench: SD1.5, 512 and 1024 px, ratio 0.5, ~8 min on 2 cores (BENCH_ARGS="..."
#                passes options, e.g. BENCH_ARGS="--full" for the full matrix, 20-25 min)
#   make peers   install the whole-generation benchmark's peers (requirements-peers.txt: CA-ToMe, DeepCache,
#                HiDiffusion) into .venv with --no-deps; optional, the tests skip a peer that is not installed
#   make bench-gen  whole generations side by side with every peer and ours at each preset: SD1.5 at 512 and
#                768 px (10 Euler steps) and SDXL at 768 px (4 steps) into bench-out/gen-sd15 and bench-out/gen-sdxl
#                (hours on 2 CPU cores)
#   make lint / make format / make clean

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

VENV ?= .venv
# First interpreter that exists and is >= 3.10, preferring 3.11 (the local CPU torch wheel is cp311).
PYTHON ?= $(shell for p in python3.11 python3.10; do \
	if $$p -c 'import sys; assert sys.version_info >= (3, 10)' >/dev/null 2>&1; then echo $$p; break; fi; done)
TORCH_VERSION ?= 2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.sd-webui-tome.stamp
PYTEST_MARK ?= not webui and not comfy
PYTEST_ARGS ?=
BENCH_ARGS ?=
RUFF_PATHS ?= .

.PHONY: venv test lint format bench peers bench-gen clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt requirements-nodeps.txt
	@if [ ! -x "$(PY)" ]; then \
		if [ -z "$(PYTHON)" ]; then echo "error: python3.11 or python3.10 is required" >&2; exit 1; fi; \
		echo "creating $(VENV) with $(PYTHON)"; \
		$(PYTHON) -m venv "$(VENV)"; \
	fi
	$(PIP) install --quiet "setuptools>=64" wheel  # editable install without build isolation (offline-friendly)
	@# torch: only the CPU wheel from the local wheel folder (pip's find-links), never a CUDA build from the
	@# index; then a second call fetches torch's pure-Python requirements (torch itself is already satisfied).
	@if ! $(PY) -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "$(TORCH_VERSION)" else 1)' 2>/dev/null; then \
		$(PIP) install --no-index --no-deps "torch==$(TORCH_VERSION)" || { \
			echo "error: no local CPU wheel of torch==$(TORCH_VERSION) (pip find-links); install a CPU build of torch" \
			     "into $(VENV) by hand, then re-run make venv" >&2; exit 1; }; \
	fi
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -r requirements-dev.txt
	$(PIP) install --quiet --no-deps -r requirements-nodeps.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	$(PY) -c 'import torch; assert torch.version.cuda is None, "a CUDA build of torch got into $(VENV)"; print("torch", torch.__version__)'
	touch $@

lint: venv
	$(VENV)/bin/ruff check $(RUFF_PATHS)
	$(VENV)/bin/ruff format --check $(RUFF_PATHS)

format: venv
	$(VENV)/bin/ruff check --fix $(RUFF_PATHS)
	$(VENV)/bin/ruff format $(RUFF_PATHS)

# pytest exits 5 when it ran no test: that fails here too (make fails on any non-zero status).
test: lint
	$(PY) -m pytest -q -m "$(PYTEST_MARK)" $(PYTEST_ARGS) || { rc=$$?; \
		if [ $$rc -eq 5 ]; then echo "error: pytest collected/ran no tests" >&2; fi; exit $$rc; }

bench: venv
	$(PY) -m tome_bench $(BENCH_ARGS)

# --no-deps: ca-tome pins torch<2.2.2 (a CUDA wheel from the index); what the peers import at run time is already
# in .venv. The check after it fails if a CUDA torch got in anyway.
peers: venv
	$(PIP) install --quiet --no-deps -r requirements-peers.txt
	$(PY) -c 'import torch, ca_tome, DeepCache, hidiffusion; assert torch.version.cuda is None; print("peers installed")'

# The two commands are tome_bench.cli.GEN_COMMANDS (python -> $(PY)); BENCH_ARGS is added to both.
bench-gen: peers
	$(PY) -m tome_bench --steps 10 --arch sd15 --sizes 512,768 --peers all --presets all --out bench-out/gen-sd15 $(BENCH_ARGS)
	$(PY) -m tome_bench --steps 4 --arch sdxl --sizes 768 --peers all --presets all --out bench-out/gen-sdxl $(BENCH_ARGS)

clean:
	rm -rf .pytest_cache .ruff_cache .hypothesis bench-out build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf

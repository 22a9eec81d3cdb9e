# sd-webui-tome developer tasks. Everything runs on the CPU, offline after `make venv`.
#   make venv    create/refresh .venv (incremental: only re-runs when a requirements file changes)
#   make test    ruff check + ruff format --check + pytest (all but live-WebUI/ComfyUI tests; browser tests skip without chromium)
#   make bench   python -m tome_bench, the main job: every preset on SD1.5 (512 px) and SDXL (640 px) beside the
#                unpatched UNet and tomesd, with the GPU estimate, into bench-out/; ~20 min on 2 cores, on the
#                GPU in fp16 where CUDA is available (BENCH_ARGS="..." passes the main job's options, e.g.
#                "--device cpu"; the other jobs: python -m tome_bench --help)
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
# First interpreter that exists and is 3.10-3.12, preferring 3.11 (the local CPU torch wheel is cp311); numpy 1.26
# has no wheels for 3.13.
PYTHON ?= $(shell for p in python3.11 python3.12 python3.10 python3; do \
	if $$p -c 'import sys; assert (3, 10) <= sys.version_info[:2] <= (3, 12)' >/dev/null 2>&1; then echo $$p; break; fi; done)
TORCH_VERSION ?= 2.13.0
# Where torch comes from when pip's find-links has no wheel of it: empty for pip's index (PyPI: a CUDA build on
# Linux), https://download.pytorch.org/whl/cpu for the CPU build, .../whl/cu128 for a CUDA 12.8 build.
TORCH_INDEX_URL ?=
# Present while .venv's torch is the local CPU wheel. CI and that wheel need a CPU build, and a later install must
# not swap it for a CUDA one; a user's own CUDA build stays.
LOCAL_TORCH := $(VENV)/.torch-from-local-wheel
CPU_TORCH_CHECK = if [ -n "$${CI:-}" ] || [ -e "$(LOCAL_TORCH)" ]; then \
	$(PY) -c 'import torch; assert torch.version.cuda is None, "a CUDA build of torch got into $(VENV)"'; fi
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.sd-webui-tome.stamp
PYTEST_MARK ?= not webui and not comfy
PYTEST_ARGS ?=
# pytest-xdist workers for make test: 2 nearly halve its time on 2 cores; PYTEST_WORKERS=0 runs all but the browser
# tests in one process.
# loadgroup: tests marked xdist_group (the stand-in fidelity, the GPU-budget traces) share one worker.
PYTEST_WORKERS ?= 2
BENCH_ARGS ?=
RUFF_PATHS ?= .

.PHONY: venv test lint format bench peers bench-gen clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt requirements-nodeps.txt
	@if [ ! -x "$(PY)" ]; then \
		if [ -z "$(PYTHON)" ]; then \
			echo "error: Python 3.10, 3.11 or 3.12 is required (python3.11/3.12/3.10/python3 on PATH, or PYTHON=...)" >&2; \
			exit 1; fi; \
		echo "creating $(VENV) with $(PYTHON)"; \
		$(PYTHON) -m venv "$(VENV)"; \
	fi
	@# pip>=22.2 for --dry-run below; setuptools and wheel: editable install without build isolation (offline-friendly)
	$(PIP) install --quiet "pip>=22.2" "setuptools>=64" wheel
	@# torch: the local CPU wheel where pip's find-links has one (--no-index: nothing downloaded; the dry run tells
	@# "no such wheel" apart from a failed install), else torch from TORCH_INDEX_URL or pip's index. Then a second
	@# call fetches torch's requirements (torch itself is already satisfied).
	@if ! $(PY) -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "$(TORCH_VERSION)" else 1)' 2>/dev/null; then \
		if $(PIP) install --quiet --dry-run --no-index --no-deps "torch==$(TORCH_VERSION)" >/dev/null 2>&1; then \
			$(PIP) install --no-index --no-deps "torch==$(TORCH_VERSION)"; \
			touch "$(LOCAL_TORCH)"; \
		else \
			echo "no wheel of torch==$(TORCH_VERSION) in pip's find-links: installing it from $(or $(TORCH_INDEX_URL),pip's index)"; \
			rm -f "$(LOCAL_TORCH)"; \
			$(PIP) install --no-deps $(if $(TORCH_INDEX_URL),--index-url "$(TORCH_INDEX_URL)") "torch==$(TORCH_VERSION)"; \
		fi; \
	fi
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -r requirements-dev.txt
	$(PIP) install --quiet --no-deps -r requirements-nodeps.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	@$(CPU_TORCH_CHECK)
	$(PY) -c 'import torch; print("torch", torch.__version__, f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU")'
	touch $@

lint: venv
	$(VENV)/bin/ruff check $(RUFF_PATHS)
	$(VENV)/bin/ruff format --check $(RUFF_PATHS)

format: venv
	$(VENV)/bin/ruff check --fix $(RUFF_PATHS)
	$(VENV)/bin/ruff format $(RUFF_PATHS)

# tests/run_suite.py: the browser tests (mostly waiting on a page) in a pytest process of their own beside the rest
# on PYTEST_WORKERS xdist workers. pytest's 5 (no test ran) fails here too (make fails on any non-zero status).
test: lint
	$(PY) tests/run_suite.py --mark "$(PYTEST_MARK)" --workers $(PYTEST_WORKERS) -- $(PYTEST_ARGS)

bench: venv
	$(PY) -m tome_bench $(BENCH_ARGS)

# --no-deps: ca-tome pins torch<2.2.2 (a CUDA wheel from the index); what the peers import at run time is already
# in .venv. The check after it fails if a CUDA torch got in anyway (in CI or over the local CPU wheel).
peers: venv
	$(PIP) install --quiet --no-deps -r requirements-peers.txt
	@$(CPU_TORCH_CHECK)
	$(PY) -c 'import torch, ca_tome, DeepCache, hidiffusion; print("peers installed")'

# The two commands are tome_bench.peers.GEN_COMMANDS (python -> $(PY)); BENCH_ARGS is added to both.
bench-gen: peers
	$(PY) -m tome_bench peers --steps 10 --arch sd15 --sizes 512,768 --peers all --presets all --out bench-out/gen-sd15 $(BENCH_ARGS)
	$(PY) -m tome_bench peers --steps 4 --arch sdxl --sizes 768 --peers all --presets all --out bench-out/gen-sdxl $(BENCH_ARGS)

clean:
	rm -rf .pytest_cache .ruff_cache .hypothesis .cache bench-out build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf

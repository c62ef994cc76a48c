# minikv: the commands the README names. Everything runs inside .venv, which `make setup` creates.
#
#   make run        the main job (minikv demo)
#   make test       unit/property/engine tests, the Python blocks of README.md and docs/, then the notebooks through
#                   nbval (CPU); not the `slow` tests
#   make test-all   the same with the `slow` tests too (every notebook in the browser, ...)
#   make test-gpu   GPU tests and both reproductions compiled on CUDA (system python with CUDA torch)
#   make notebooks  sync the .py/.ipynb pairs and re-execute the CPU notebooks in place
#   make docs       the static site, built offline into site/
#   make lab        JupyterLab on notebooks/
#   make bench      kernel benchmarks
#   make results    re-run both reproductions into results/*.json, then write their figures into README and docs
#   make clean      remove built outputs (keeps .venv); `make distclean` removes .venv too

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-done
# torch is pinned exactly: a range would let pip pick a newer, multi-GB CUDA build.
TORCH  := torch==2.13.0

NOTEBOOKS     := $(sort $(wildcard notebooks/*.ipynb))
# 05 is recorded on a GPU: `make notebooks` never re-executes it (nbval skips its `# NBVAL_SKIP` cells on CPU).
GPU_NOTEBOOKS := notebooks/05_gpu_performance.ipynb
NBVAL_FLAGS   := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg
KERNEL        := python3

.PHONY: setup run test test-all test-gpu notebooks docs lab bench results clean distclean

setup: $(STAMP)

# One pip run for everything (playwright: the driver only; the browser test uses Debian's /usr/bin/chromium), then
# the bytecode compiled on every core: pip compiles file by file on one, which was 45 s of a fresh setup. The
# bytecode is needed: where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) a module not compiled now would
# be compiled again at every import, in every test worker and notebook kernel. compileall's status is ignored,
# as pip ignores it: a few packages ship files for other Python versions (torch's py312_intrinsics.py).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --no-compile $(TORCH) -e ".[dev,notebooks,docs]" playwright
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/minikv demo

# Tiny tensors: one thread is faster than two, and steadier on a busy machine. (No MPLBACKEND for nbval: the
# notebooks draw inline, and a figure output missing from a re-run would not match the recorded one.)
TEST_ENV := TQDM_DISABLE=1 OMP_NUM_THREADS=1

# The notebooks are verified twice. First in the environment make runs in (an ATEN_CPU_CAPABILITY set outside is
# kept), then in a second float environment: torch's generic CPU kernels (ATEN_CPU_CAPABILITY=default, or the
# native ones when the first pass already was `default`) and two threads. float32 results differ in their last bits
# between those, as they do between a learner's laptop, a CI runner and the machine that recorded the outputs, so
# an output that depends on them fails here rather than for a user (CONTRIBUTING.md, "What a notebook may print").
# The second pass covers every notebook: each of 01-04 prints results of float computation, and 05 costs seconds;
# both passes together take about 3 minutes of the 10 the whole target may take from a fresh clone (README, "The two commands").
OTHER_CPU_KERNELS := $(if $(filter default,$(ATEN_CPU_CAPABILITY)),\
	env -u ATEN_CPU_CAPABILITY,ATEN_CPU_CAPABILITY=default)
# OMP_WAIT_POLICY=PASSIVE: an OpenMP thread with no work sleeps instead of spinning. Two workers of two threads each
# on two cores otherwise spin against each other (the pass took 151 s that way, 100 s with it); results are the same.
SECOND_FLOAT_ENV  := $(OTHER_CPU_KERNELS) OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE

# Two pytest workers (pytest-xdist), one per core of the 2-core machines this runs on; a test file stays on one
# worker (--dist loadfile), so its module-scoped engines are built once, and a notebook's cells run in one kernel.
# MARKS selects the tests: `make test` leaves out the `slow` ones, whose property a faster test also asserts.
WORKERS ?= 2
XDIST   := -n $(WORKERS) --dist loadfile
MARKS   ?= not slow

# Every Python block of README.md and docs/ runs as a test (pytest-markdown-docs; the superfences syntax is the one
# the site renders, so a block names a skipping fixture of ./conftest.py as `{.python fixture:needs_cuda}`).
DOC_BLOCKS := -p no:cacheprovider --markdown-docs --markdown-docs-syntax=superfences -m markdown-docs README.md docs

# lint-imports first: the layer contracts in pyproject.toml (no upward import, no import loop), in a second.
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(TEST_ENV) MPLBACKEND=Agg $(PY) -m pytest -q $(XDIST) -m "$(MARKS)" --durations=30 tests
	$(TEST_ENV) MPLBACKEND=Agg $(PY) -m pytest -q $(DOC_BLOCKS)
ifneq ($(NOTEBOOKS),)
	$(TEST_ENV) $(PY) -m pytest -q $(XDIST) -p no:cacheprovider $(NBVAL_FLAGS) $(NOTEBOOKS)
	$(TEST_ENV) $(SECOND_FLOAT_ENV) $(PY) -m pytest -q $(XDIST) -p no:cacheprovider $(NBVAL_FLAGS) $(NOTEBOOKS)
else
	@echo "no notebooks/*.ipynb yet: nbval skipped"
endif

test-all: $(STAMP)
	$(MAKE) test MARKS=""

# On a GPU machine whose python3 already has a CUDA build of torch (no .venv: that would bring the CPU build).
# `tools/gpu.sh tests` holds the steps (the GPU tests in parallel workers, both reproductions on CUDA, the wall time
# printed last), so a machine without make runs the same; `tools/gpu.sh bench` records notebook 05's CSV.
test-gpu:
	$(PYTHON) -m pip install --quiet --no-deps --no-build-isolation -e .
	PYTHON=$(PYTHON) bash tools/gpu.sh tests

notebooks: $(STAMP)
	$(PY) tools/sync_notebooks.py
	@set -e; for nb in notebooks/*.ipynb; do \
		[ -e "$$nb" ] || continue; \
		case " $(GPU_NOTEBOOKS) " in *" $$nb "*) echo "not re-executing $$nb (recorded on a GPU)"; continue;; esac; \
		echo "executing $$nb"; \
		TQDM_DISABLE=1 $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
			--ExecutePreprocessor.kernel_name=$(KERNEL) --ExecutePreprocessor.timeout=1800 "$$nb"; \
	done
	$(PY) tools/sync_notebooks.py

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

bench: $(STAMP)
	$(PY) -m minikv.bench kernels

# One number per quantity: each reproduction writes its measured figures to results/NAME.json, and the renderer
# writes them into the marked blocks of README.md and docs/**/*.md (tests/test_results.py checks they agree).
results: $(STAMP)
	TQDM_DISABLE=1 $(VENV)/bin/minikv repro scale-wipe --results results/scale_wipe.json
	TQDM_DISABLE=1 $(VENV)/bin/minikv repro cross-stride --results results/cross_stride.json
	TQDM_DISABLE=1 $(VENV)/bin/minikv repro scale-wipe --model tiny-gemma4-e2b --formats int8_per_token_head \
	  --results results/scale_wipe_e2b.json
	$(PY) tools/render_results.py

clean:
	rm -rf site build .pytest_cache .hypothesis .cache .ruff_cache
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

#!/usr/bin/env bash
# `make test-gpu`'s steps, also run directly on a GPU machine without make (the lent H200), from the repo root:
#   bash tools/gpu_test.sh [LOG]
# The GPU tests (tests marked `gpu`) in parallel worker processes (pytest-xdist: compiling Triton kernels is CPU
# work, so a cold cache is filled by all cores at once), then both reproductions on CUDA. Prints the wall time of
# the whole run last; with LOG, everything is also written there. TRITON_CACHE_DIR=fresh starts from an empty
# kernel cache (what a fresh machine has).
set -uo pipefail
LOG=${1:-/dev/null}
PY=${PYTHON:-python3}
WORKERS=${GPU_TEST_WORKERS:-8}
if [ "${TRITON_CACHE_DIR:-}" = fresh ]; then export TRITON_CACHE_DIR=$(mktemp -d); fi
export TQDM_DISABLE=1
start=$(date +%s)
status=0
{
  if $PY -c "import xdist" 2>/dev/null; then PAR="-n $WORKERS"; else PAR=""; echo "(pytest-xdist missing: serial)"; fi
  $PY -m pytest -q -m gpu -p no:cacheprovider $PAR --durations=15 tests/test_kernels_gpu.py tests/test_gpu_engine.py \
    tests/test_engine.py tests/test_engine_perlayer.py tests/test_parity_gpu.py || status=1
  $PY -m minikv repro scale-wipe --device cuda || status=1
  $PY -m minikv repro cross-stride --device cuda || status=1
  echo "make test-gpu: exit status $status, $(( $(date +%s) - start )) s wall ($(nproc) CPU cores, $WORKERS test workers," \
       "Triton cache ${TRITON_CACHE_DIR:-default})"
} 2>&1 | tee "$LOG"
exit $status

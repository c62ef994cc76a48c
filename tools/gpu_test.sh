#!/usr/bin/env bash
# `make test-gpu`'s steps, also run directly on a GPU machine without make (the lent H200), from the repo root:
#   bash tools/gpu_test.sh [LOG]
# The GPU tests (tests marked `gpu`) in parallel worker processes (pytest-xdist: compiling Triton kernels is CPU
# work, so a cold cache is filled by all cores at once), and beside them both reproductions on CUDA. Prints the
# wall time of the whole run last; with LOG, everything is also written there. TRITON_CACHE_DIR=fresh starts from
# an empty kernel cache (what a fresh machine has).
set -uo pipefail
LOG=${1:-/dev/null}
PY=${PYTHON:-python3}
WORKERS=${GPU_TEST_WORKERS:-8}
if [ "${TRITON_CACHE_DIR:-}" = fresh ]; then export TRITON_CACHE_DIR=$(mktemp -d); fi
export TQDM_DISABLE=1
TMP=$(mktemp -d)
start=$(date +%s)
{
  PAR=$($PY - "$WORKERS" <<'PY'
import sys
try:
    import xdist
    major, minor = (int(x) for x in xdist.__version__.split(".")[:2])
    print(f"-n {sys.argv[1]}" + (" --dist worksteal" if (major, minor) >= (3, 2) else ""))
except ImportError:
    print("")
PY
)
  [ -n "$PAR" ] || echo "(pytest-xdist missing: the tests run one at a time)"
  ( $PY -m minikv repro scale-wipe --device cuda > "$TMP/wipe.log" 2>&1; echo $? > "$TMP/wipe.rc" ) &
  ( $PY -m minikv repro cross-stride --device cuda > "$TMP/cross.log" 2>&1; echo $? > "$TMP/cross.rc" ) &
  $PY -m pytest -q -m gpu -p no:cacheprovider $PAR --durations=15 tests/test_kernels_gpu.py tests/test_gpu_engine.py \
    tests/test_engine.py tests/test_engine_perlayer.py tests/test_parity_gpu.py
  status=$?
  wait
  for r in wipe cross; do
    echo "== minikv repro $([ $r = wipe ] && echo scale-wipe || echo cross-stride) --device cuda (exit $(cat $TMP/$r.rc))"
    cat "$TMP/$r.log"
    [ "$(cat $TMP/$r.rc)" = 0 ] || status=1
  done
  echo "make test-gpu: exit status $status, $(( $(date +%s) - start )) s wall ($(nproc) CPU cores, ${PAR:-serial}," \
       "Triton cache ${TRITON_CACHE_DIR:-default})"
  echo $status > "$TMP/status"
} 2>&1 | tee "$LOG"
exit "$(cat "$TMP/status")"

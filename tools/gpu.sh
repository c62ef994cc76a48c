#!/usr/bin/env bash
# Everything minikv runs on a CUDA machine, from the repo root, with one preamble (install without downloads,
# wheels carried in .whl/ put on PYTHONPATH, versions printed):
#
#   bash tools/gpu.sh tests      # `make test-gpu`: the tests marked gpu (pytest-xdist workers: compiling Triton
#                                #   kernels is CPU work) beside both reproductions on CUDA; the wall time last
#   bash tools/gpu.sh repro      # both reproductions on CUDA
#   bash tools/gpu.sh bench      # `minikv.bench attention` (kernel targets) and `minikv.bench engine --device cuda`
#                                #   (end-to-end targets), CSVs into $OUT
#   bash tools/gpu.sh tune       # the launch-configuration sweep and an Nsight Compute profile of the decode kernel
#   bash tools/gpu.sh notebook   # notebook 05 executed and recorded (its first cell runs the attention benchmark)
#   bash tools/gpu.sh fidelity   # the full-size random checkpoints against transformers, both repros on them
#   bash tools/gpu.sh memcheck   # defect B1 under compute-sanitizer (tools/memcheck_cross_stride.py)
#
# Several steps in one call run in order: `bash tools/gpu.sh tests bench`. Logs and results go to $OUT (default
# build/gpu); PYTHON picks the interpreter (default python3); TRITON_CACHE_DIR=fresh starts from an empty kernel
# cache (what a fresh machine has). The exit status is 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if [ "${TRITON_CACHE_DIR:-}" = fresh ]; then export TRITON_CACHE_DIR=$(mktemp -d); fi
status=0
[ $# -gt 0 ] || { sed -n '2,17p' "$0"; exit 2; }

# ---- the one preamble -------------------------------------------------------------------------------------------
if [ -z "${WHEELS_INSTALLED:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export WHEELS_INSTALLED=1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:/tmp/site"
$PY -c "import minikv.kernels" 2>/dev/null || $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . \
  >/dev/null 2>&1 || true
$PY -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
$PY - <<'PY' | tee "$OUT/env.txt"
import torch, triton, minikv.kernels as k
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print("gpu:", gpu, "| torch", torch.__version__, "| triton", triton.__version__, "| kernels:", k.mode.mode_name())
PY

# ---- steps ------------------------------------------------------------------------------------------------------
tests() {
  local tmp start par
  tmp=$(mktemp -d); start=$(date +%s)
  par=$($PY - "${GPU_TEST_WORKERS:-8}" <<'PY'
import sys
try:
    import xdist
    major, minor = (int(x) for x in xdist.__version__.split(".")[:2])
    print(f"-n {sys.argv[1]}" + (" --dist worksteal" if (major, minor) >= (3, 2) else ""))
except ImportError:
    print("")
PY
)
  [ -n "$par" ] || echo "(pytest-xdist missing: the tests run one at a time)"
  ( $PY -m minikv repro scale-wipe --device cuda > "$tmp/wipe.log" 2>&1; echo $? > "$tmp/wipe.rc" ) &
  ( $PY -m minikv repro cross-stride --device cuda > "$tmp/cross.log" 2>&1; echo $? > "$tmp/cross.rc" ) &
  $PY -m pytest -q -m gpu -p no:cacheprovider $par --durations=15 ${GPU_TESTS:-tests/test_kernels_gpu.py \
    tests/test_gpu_engine.py tests/test_gpu_graphs.py tests/test_engine.py tests/test_engine_perlayer.py \
    tests/test_parity_gpu.py}
  local rc=$?
  wait
  for r in wipe cross; do
    echo "== minikv repro $([ $r = wipe ] && echo scale-wipe || echo cross-stride) --device cuda (exit $(cat $tmp/$r.rc))"
    cat "$tmp/$r.log"
    [ "$(cat $tmp/$r.rc)" = 0 ] || rc=1
  done
  echo "make test-gpu: exit status $rc, $(( $(date +%s) - start )) s wall ($(nproc) CPU cores, ${par:-serial}," \
       "Triton cache ${TRITON_CACHE_DIR:-default})"
  return $rc
}

repro() {
  timeout 70 $PY -m minikv repro scale-wipe --device cuda || return 1
  timeout 45 $PY -m minikv repro cross-stride --device cuda
}

bench() {
  timeout ${BENCH_TIMEOUT:-300} $PY -m minikv.bench attention --csv "$OUT/attention.csv" ${ATTENTION_ARGS:-} \
    || return 1
  timeout ${BENCH_TIMEOUT:-300} $PY -m minikv.bench engine --device cuda --csv "$OUT/engine.csv" ${ENGINE_ARGS:-}
}

tune() {
  timeout ${SWEEP_TIMEOUT:-330} $PY -m minikv.bench.attention_sweep --out "$OUT" ${SWEEP_ARGS:-} 2>&1 \
    | tee "$OUT/sweep.log" | grep -v "^  failed" | tail -60
  timeout 150 /usr/local/cuda/bin/ncu --clock-control none --target-processes all -k regex:_decode_ \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    --section WarpStateStats --csv --page details $PY tools/profile_decode.py run ${PROFILE_FORMATS:-} \
    > "$OUT/ncu_decode.csv" 2> "$OUT/ncu.err"
  echo "ncu exit $?"; tail -3 "$OUT/ncu.err"
  $PY tools/profile_decode.py summarize "$OUT/ncu_decode.csv" | tee "$OUT/ncu_summary.txt"
}

notebook() {
  mkdir -p notebooks/data
  $PY -m jupytext --to ipynb notebooks/05_gpu_performance.py || return 1
  (cd notebooks && timeout 270 $PY - <<'PY') 2>&1 | tee "$OUT/notebook05.log"
import nbformat, nbclient
nb = nbformat.read("05_gpu_performance.ipynb", as_version=4)
try:
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=260, resources={"metadata": {"path": "."}}).execute()
finally:
    nbformat.write(nb, "05_gpu_performance.ipynb")
print("notebook 05 executed")
PY
  cp notebooks/05_gpu_performance.ipynb notebooks/data/gpu_attention.csv "$OUT/"
}

fidelity() { OUT="$OUT" PYTHON="$PY" bash tools/fidelity_device.sh e2b t5; }
memcheck() { OUT="$OUT" PYTHON="$PY" bash tools/fidelity_device.sh memcheck; }

for step in "$@"; do
  case "$step" in
    tests|repro|bench|tune|notebook|fidelity|memcheck) ;;
    *) echo "unknown step '$step': choose from tests repro bench tune notebook fidelity memcheck"; exit 2 ;;
  esac
  echo "== $step"
  "$step" 2>&1 | tee "$OUT/$step.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "== $step failed (exit $rc)"; status=1; }
done
echo "tools/gpu.sh $*: exit status $status"
exit $status

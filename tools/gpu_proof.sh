#!/usr/bin/env bash
# The GPU proof, run on a machine with an NVIDIA GPU and no network (e.g. the lent H200), from the repo root:
#   bash tools/gpu_proof.sh [tests] [repro] [notebook]      (default: all three)
# Installs minikv without downloads (wheels for the notebook runner may be carried in .whl/), then runs the GPU
# tests, both reproductions on CUDA, and notebook 05, which runs the attention benchmark and records its outputs.
# Logs and results go to $OUT (default build/gpu).
set -uo pipefail
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1   # no MPLBACKEND: the notebook draws inline
status=0
step() { echo "== $*"; }
want() { [ -z "$SELECTED" ] || [[ " $SELECTED " == *" $1 "* ]]; }
SELECTED="$*"

if [ -z "${WHEELS_INSTALLED:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || true
# Without an installed package, expose the top-level kernels/ folder as minikv.kernels for this run.
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
python3 - <<'PY' | tee "$OUT/env.txt"
import torch, triton, minikv.kernels as k
print("gpu:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| triton", triton.__version__,
      "| kernels:", k.mode.mode_name())
PY

if want tests; then
step "GPU tests (make test-gpu)"
# test_parity_gpu.py needs transformers: carry its wheels in .whl/ (the H200 has none, or an older one)
timeout 330 bash tools/gpu_test.sh "$OUT/test-gpu.log" || status=1
fi

if want repro; then
step "repro scale-wipe on CUDA"
timeout 70 python3 -m minikv repro scale-wipe --device cuda 2>&1 | tee "$OUT/repro-scale-wipe.log" || status=1
step "repro cross-stride on CUDA"
timeout 45 python3 -m minikv repro cross-stride --device cuda 2>&1 | tee "$OUT/repro-cross-stride.log" || status=1
fi

if want notebook; then
step "notebook 05 (attention benchmark, outputs recorded here)"
mkdir -p notebooks/data
python3 -m jupytext --to ipynb notebooks/05_gpu_performance.py || status=1
(cd notebooks && timeout 270 python3 - <<'PY') 2>&1 | tee "$OUT/notebook05.log" || status=1
import nbformat, nbclient
nb = nbformat.read("05_gpu_performance.ipynb", as_version=4)
try:
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=260, resources={"metadata": {"path": "."}}).execute()
finally:
    nbformat.write(nb, "05_gpu_performance.ipynb")
print("notebook 05 executed")
PY
cp notebooks/05_gpu_performance.ipynb "$OUT/" || status=1
cp notebooks/data/gpu_attention.csv "$OUT/" || status=1
fi
echo "gpu proof exit status: $status"
exit $status

#!/usr/bin/env bash
# The scale-placement run on the lent H200, from the repo root:   OUT=dir bash tools/gpu_placement.sh
# GPU kernel tests (both placements), the launch sweep of the "/block" formats (minikv.bench.placement_sweep), then
# `python -m minikv.bench attention` with its winners, row and block placements side by side, and the registers
# of every compiled decode kernel. Everything lands in $OUT.
set -uo pipefail
OUT=${OUT:-build/placement}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || true
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
python3 -c "import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)" \
  | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$OUT/env.txt"
echo "== GPU kernel tests"
timeout ${TEST_TIMEOUT:-110} python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_kernels_gpu.py 2>&1 \
  | tail -15 | tee "$OUT/test-gpu.log"
echo "== placement sweep, then the attention benchmark"
timeout ${SWEEP_TIMEOUT:-290} python3 -m minikv.bench.placement_sweep --out "$OUT" --bench 2>&1 \
  | grep -v "^  failed" | tee "$OUT/placement.log"

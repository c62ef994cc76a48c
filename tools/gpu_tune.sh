#!/usr/bin/env bash
# Tuning run for the attention kernels on a CUDA machine (the lent H200), from the repo root:
#   OUT=dir bash tools/gpu_tune.sh [tests] [sweep] [ncu]      (default: all three)
# GPU kernel tests, the launch-configuration sweep (minikv.bench.attention_sweep: the row placement's decode table
# and the context tiles) and an Nsight Compute profile of the decode kernel per format at batch 64 / context 4096
# with the engine's configurations.
set -uo pipefail
OUT=${OUT:-build/tune}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
SELECTED="$*"
want() { [ -z "$SELECTED" ] || [[ " $SELECTED " == *" $1 "* ]]; }
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || true
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
python3 -c "import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)" \
  | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$OUT/env.txt"
if want tests; then
  echo "== GPU kernel tests"
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_kernels_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/test-gpu.log"
fi
if want sweep; then
  echo "== sweep"
  timeout ${SWEEP_TIMEOUT:-330} python3 -m minikv.bench.attention_sweep --out "$OUT" ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.log" \
    | grep -v "^  failed" | tail -60
fi
if want ncu; then
  echo "== ncu"
  timeout 100 /usr/local/cuda/bin/ncu --clock-control none --target-processes all -k regex:_decode_ \
    --launch-count 8 --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
    --section Occupancy --csv --page details python3 tools/profile_decode.py run \
    > "$OUT/ncu_decode.csv" 2> "$OUT/ncu.err"
  echo "ncu exit $?"; tail -3 "$OUT/ncu.err"
  python3 tools/profile_decode.py summarize "$OUT/ncu_decode.csv" | tee "$OUT/ncu_summary.txt"
fi

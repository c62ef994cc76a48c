#!/usr/bin/env bash
# Issue 20's first GPU call (from the copy of this tree inside main's checkout, `.gpu/gpu`, whose parent repo root
# holds main's code: "today's kernels" and the old engine for the GPU token baseline):
#   bash tools/gpu_probe.sh            results under $OUT (default build/probe), at most 8 files
# 1. versions, whether Gluon imports; 2. tools/gpu_probe.py (every candidate decode configuration checked and
# timed beside today's kernels); 3. Nsight Compute on each format's best at batch 64 / context 4096;
# 4. the GPU tests from a cold Triton cache (timed) beside the old engine's token ids on CUDA.
set -uo pipefail
OUT=${OUT:-build/probe}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
ROOT=$(cd ../.. && pwd)                      # main's checkout
HERE=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 || echo "wheel install failed"
fi
ln -sfn ../kernels minikv/kernels; ln -sfn ../kernels "$ROOT/minikv/kernels"
mkdir -p /tmp/old && ln -sfn "$ROOT/kernels" /tmp/old/oldkernels
export PYTHONPATH="$HERE:/tmp/site"
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  python3 - <<'PY'
import torch, triton
print("torch", torch.__version__, "| triton", triton.__version__, "| cuda", torch.version.cuda,
      "| SMs", torch.cuda.get_device_properties(0).multi_processor_count)
try:
    import triton.experimental.gluon as gluon  # noqa: F401
    from triton.experimental.gluon import language as gl  # noqa: F401
    print("gluon: imports")
except Exception as e:  # noqa: BLE001
    print("gluon: no", type(e).__name__, e)
import transformers; print("transformers", transformers.__version__)
PY
  which ncu compute-sanitizer || ls /usr/local/cuda/bin | head
} 2>&1 | tee "$OUT/logs/env.txt"

echo "== probe"
timeout 250 python3 tools/gpu_probe.py --out "$OUT/logs" --old /tmp/old 2>&1 > "$OUT/logs/probe.log"; echo "probe exit $?"
tail -60 "$OUT/logs/probe.log"

echo "== ncu"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 80 "$NCU" --clock-control none -k regex:_decode_kernel --csv --page details \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
  --section WarpStateStats --section SchedulerStats \
  python3 tools/profile_decode.py run "$OUT/logs/best.json" > "$OUT/logs/ncu_decode.csv" 2> "$OUT/logs/ncu.err"
echo "ncu exit $?"; tail -3 "$OUT/logs/ncu.err"
python3 tools/profile_decode.py summarize "$OUT/logs/ncu_decode.csv" 2>&1 | tee "$OUT/logs/ncu_summary.txt" | cut -c1-400

echo "== GPU tests (cold Triton cache) beside the old engine's tokens"
(cd "$ROOT" && PYTHONPATH="$ROOT:/tmp/site" TRITON_CACHE_DIR=$(mktemp -d) timeout 200 python3 "$HERE/tools/gpu_tokens.py" \
  "$OUT/logs/tokens_main_26a2833_cuda.json" > "$OUT/logs/tokens_old.log" 2>&1; echo "old tokens exit $?" >> "$OUT/logs/tokens_old.log") &
TRITON_CACHE_DIR=fresh GPU_TEST_WORKERS=8 timeout 210 bash tools/gpu_test.sh "$OUT/logs/test-gpu.log" > /dev/null 2>&1
echo "test-gpu exit $?"; grep -E "passed|failed|error|make test-gpu" "$OUT/logs/test-gpu.log" | tail -8
wait
tail -4 "$OUT/logs/tokens_old.log"
(cd "$OUT" && tar czf probe_logs.tgz logs && cp logs/probe.csv logs/best.json logs/ncu_summary.txt . 2>/dev/null; rm -rf logs)
ls -la "$OUT"

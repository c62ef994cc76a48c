#!/usr/bin/env bash
# Issue 20's recording run on the lent H200, in one call, from the repo root (wheels for the notebook runner and
# transformers in .whl/: `bash tools/record_gpu_notebook.sh wheels`):
#   OUT=dir bash tools/gpu_final.sh
# 1. `make test-gpu`'s steps from a cold Triton cache, timed (tools/gpu_test.sh), and beside them the engine's
#    token ids on CUDA for every shipped model and format (tools/gpu_tokens.py);
# 2. notebook 05, executed and recorded there (tools/gpu_proof.sh notebook): its first cell runs the attention
#    benchmark (targets printed met/MISSED) and `minikv.bench engine`'s CUDA run, into one CSV.
# $OUT gets the notebook, its CSV, the token ids and logs.tgz (every log); at most 8 files.
set -uo pipefail
OUT=${OUT:-build/final}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
start=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/logs/wheels.log" 2>&1 || echo "wheel install failed (see wheels.log)"
fi
export PYTHONPATH="$PWD:/tmp/site"
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
export TRITON_CACHE_DIR=$(mktemp -d)          # empty: the test run below starts cold, the notebook reuses it
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
  git log --oneline -1 2>/dev/null || true
} 2>&1 | tee "$OUT/logs/env.txt"

echo "== make test-gpu (cold Triton cache) beside the token ids on CUDA"
(timeout 220 python3 tools/gpu_tokens.py "$OUT/tokens_v3_cuda.json" > "$OUT/logs/tokens_v3.log" 2>&1;
 echo "tokens exit $?" >> "$OUT/logs/tokens_v3.log") &
GPU_TEST_WORKERS=12 timeout 230 bash tools/gpu_test.sh "$OUT/logs/test-gpu.log" > /dev/null 2>&1
echo "test-gpu exit $?"
grep -E " passed| failed|error|FAILED|make test-gpu" "$OUT/logs/test-gpu.log" | tail -12
wait
tail -3 "$OUT/logs/tokens_v3.log"

echo "== notebook 05 (attention benchmark and engine decode, recorded)"
WHEELS_INSTALLED=1 OUT="$OUT/logs" bash tools/gpu_proof.sh notebook > "$OUT/logs/proof.log" 2>&1
echo "notebook exit $?"
cp "$OUT/logs/05_gpu_performance.ipynb" "$OUT/logs/gpu_attention.csv" "$OUT/" 2>/dev/null
grep -E "^(met|MISSED)|Error|error" "$OUT/logs/notebook05.log" | head -30
python3 - "$OUT/gpu_attention.csv" <<'PY' 2>&1 | tee "$OUT/logs/targets.txt"
import csv, sys
from minikv.bench.attention import format_targets
rows = [{k: (float(v) if k not in ("kind", "format", "gpu", "torch", "triton", "timing", "sdpa_timing", "kernel")
             and v != "" else v) for k, v in r.items()} for r in csv.DictReader(open(sys.argv[1]))]
print("\n".join(format_targets(rows)))
for r in rows:
    if r["kind"] == "decode" and int(r["batch"]) == 64 and int(r["context"]) == 4096:
        print(f"{r['format']:27s} {1e3 * r['ms']:7.1f} us  {r['kernel']}")
    if r["kind"] == "engine-decode":
        print(f"engine {r['format']:22s} {r['tokens_per_s']:8.0f} decode tokens/s")
PY
echo "final run: $(( $(date +%s) - start )) s"
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
ls -la "$OUT"

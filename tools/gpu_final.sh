#!/usr/bin/env bash
# The recording run for issue 15 on the lent H200, from the repo root (wheels for the notebook runner in .whl/):
#   OUT=dir bash tools/gpu_final.sh
# GPU kernel tests (parallel), the engine's GPU tests, notebook 05 (runs `minikv.bench attention`, recorded there),
# the model-sized decode step per format, both reproductions on CUDA, and the fused cross step's float16 option.
# The notebook, its CSV and the decode-step CSV land in $OUT; every log goes into $OUT/logs.tgz.
set -uo pipefail
OUT=${OUT:-build/final}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT="$OUT/logs" bash tools/gpu_tune.sh tests
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gpu_engine.py tests/test_engine.py 2>&1 \
  | tail -5 | tee "$OUT/logs/test-engine-gpu.log"
OUT="$OUT/logs" bash tools/gpu_proof.sh notebook
cp "$OUT/logs/05_gpu_performance.ipynb" "$OUT/logs/gpu_attention.csv" "$OUT/" 2>/dev/null
timeout 150 python3 -m minikv.bench.decode_step --csv "$OUT/gpu_decode_step.csv" 2>&1 | tee "$OUT/logs/decode_step.log"
OUT="$OUT/logs" timeout 120 bash tools/gpu_proof.sh repro | tail -12
timeout 90 python3 -m minikv.bench.attention_sweep --out "$OUT/logs" --skip decode --only "fused fp8" 2>&1 | tail -8
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)

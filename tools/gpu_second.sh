#!/usr/bin/env bash
# Issue 20's second GPU call (short): the decode GPU tests from a cold cache, then tools/gpu_probe.py --second
# (the chosen defaults, the vectorized split merge and a few shared-memory-saving alternatives, timed).
#   OUT=dir bash tools/gpu_second.sh
set -uo pipefail
OUT=${OUT:-build/second}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH="$PWD"
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
export TRITON_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 -x tests/test_kernels_gpu.py \
  -k "decode or relative_bias or mixed" > "$OUT/test-decode.log" 2>&1
echo "decode tests exit $? after $(( $(date +%s) - start )) s"; tail -4 "$OUT/test-decode.log"
grep -E "^FAILED|Error" "$OUT/test-decode.log" | head -10
timeout 130 python3 tools/gpu_probe.py --second --out "$OUT" > "$OUT/probe.log" 2>&1
echo "probe exit $? after $(( $(date +%s) - start )) s"
grep -A40 "failing variants" "$OUT/probe.log"

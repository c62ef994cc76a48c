#!/usr/bin/env bash
# Issue 22's GPU run, on a CUDA machine without network (the lent H200), from the repo root:
#   bash tools/fidelity_device.sh [memcheck] [e2b] [t5]        (default: all three; logs into $OUT)
#
# memcheck  defect B1 under `compute-sanitizer --tool memcheck` (tools/memcheck_cross_stride.py): one arena (the
#           overrun stays inside the allocation: no report, silently wrong tokens) against one allocation per pool
#           (TensorRT-LLM's shape: out-of-bounds accesses reported), the fixed backend and a 2x pool (no report)
# e2b       gemma-4-E2B's full text model with random weights, built and saved (bf16, sharded) by transformers with
#           a tokenizer.json; minikv loads it and matches transformers' logits; the scale-wipe repro on it
# t5        the same at flan-t5-base's dimensions; the cross-stride repro (B1 thresholds, B2) on it
# Needs transformers >= 5.24 (carry its wheel in .whl/; the machine's own is older).
# DRY=1: a dry run on a CPU machine at small dimensions, without the sanitizer (PYTHON=.venv/bin/python there).
# PADDING: bytes of unallocated padding memcheck puts after every CUDA allocation (default 1 MiB). Without it the
# driver packs small cudaMallocs back to back, so an overrun of one pool lands inside the next allocation, which
# memcheck counts as valid memory (the first run here: 0 errors and silently wrong tokens with separate pools too);
# PADDING=0 leaves it out.
set -uo pipefail
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
SELECTED="$*"
want() { [ -z "$SELECTED" ] || [[ " $SELECTED " == *" $1 "* ]]; }
status=0
PY=${PYTHON:-python3}
if [ -n "${DRY:-}" ]; then
  SANITIZER=""; DIMS="tiny cpu"; DEVICE=cpu
else
  PAD=${PADDING-1048576}
  SANITIZER="compute-sanitizer --tool memcheck --print-limit 4${PAD:+ --padding $PAD}"; DIMS=""; DEVICE=cuda
  [ "$PAD" = 0 ] && SANITIZER="compute-sanitizer --tool memcheck --print-limit 4"
fi

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
$PY -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
$PY -c "
import torch, triton, transformers, tokenizers
print('gpu:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none', '| torch', torch.__version__,
      '| triton', triton.__version__, '| transformers', transformers.__version__, '| tokenizers', tokenizers.__version__)
" | tee "$OUT/env.txt"
if [ -n "$SANITIZER" ]; then
  compute-sanitizer --version 2>&1 | head -3 | tee -a "$OUT/env.txt"
  compute-sanitizer --help 2>&1 | grep -A2 -- "--padding" | tee -a "$OUT/env.txt"
fi

if want memcheck; then
  log="$OUT/memcheck_cross_stride.log"
  : > "$log"
  timeout 40 $PY tools/memcheck_cross_stride.py reference /tmp/memcheck_ref.json 2>&1 | tee -a "$log" || status=1
  # compile the historical kernels once without the sanitizer (the one-arena case stays inside its allocation)
  timeout 30 $PY tools/memcheck_cross_stride.py one-arena-historical-1.5x --reference /tmp/memcheck_ref.json \
    2>&1 | grep RESULT | sed 's/^RESULT/warm-up, no sanitizer:/' | tee -a "$log"
  cases="one-arena-historical-1.5x per-pool-historical-1.5x per-pool-fixed-1.5x per-pool-historical-2x"
  for case in $cases; do                       # one process each, side by side on the one GPU
    ( echo "== ${SANITIZER:-no sanitizer (dry run)}: $case"
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 60 $SANITIZER $PY tools/memcheck_cross_stride.py "$case" \
        --reference /tmp/memcheck_ref.json 2>&1 | grep -v "Host Frame"
      echo "== exit status ${PIPESTATUS[0]}" ) > "/tmp/memcheck_$case.txt" &
  done
  wait
  for case in $cases; do cat "/tmp/memcheck_$case.txt" | tee -a "$log"; done
fi

t5_block() {
  log="$OUT/flan_t5_base_fullsize.log"
  rm -rf /tmp/t5b
  timeout 60 $PY tools/fullsize_parity.py t5 /tmp/t5b $DIMS 2>&1 | grep -v "Writing\|deprecated\|output = func" \
    > "$log" || status=1
  timeout 120 $PY -m minikv repro cross-stride --model /tmp/t5b --device $DEVICE 2>&1 | grep -v "falls back" \
    >> "$log" || status=1
}
if want t5; then t5_block & fi                 # beside the E2B steps: small, and the GPU has room for both

if want e2b; then
  log="$OUT/e2b_fullsize.log"
  rm -rf /tmp/e2b
  timeout 120 $PY tools/fullsize_parity.py gemma4 /tmp/e2b $DIMS 2>&1 | grep -v "Writing\|deprecated\|output = func" \
    | tee "$log" || status=1
  timeout 110 $PY -m minikv repro scale-wipe --model /tmp/e2b --device $DEVICE --max-num-seqs 4 --requests 8 \
    --formats int8_per_token_head --skip-extras --damage attention 2>&1 | tee -a "$log" || status=1
  rm -rf /tmp/e2b
fi
wait
[ -f "$OUT/flan_t5_base_fullsize.log" ] && cat "$OUT/flan_t5_base_fullsize.log"
echo "fidelity device run exit status: $status"
exit $status

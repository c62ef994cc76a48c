#!/usr/bin/env bash
# Issue 20's fourth GPU call (short), after the score-scale fold of the context kernel was reverted: the context
# rows of the attention benchmark again (prefill and cross context step, with SDPA and the ceilings, one run), the
# GPU context tests and `minikv repro cross-stride` on CUDA.   OUT=dir bash tools/gpu_context.sh
set -uo pipefail
OUT=${OUT:-build/context}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH="$PWD"
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
export TRITON_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 60 python3 - "$OUT/context_rows.csv" <<'PY' 2>&1 | tee "$OUT/context_bench.log"
import sys, torch, triton
from minikv.bench import attention
ceil = attention.ceilings()
rows = attention.prefill_cases() + attention.cross_context_cases()
gpu = torch.cuda.get_device_name()
for r in rows:
    r.update(copy_GBps=ceil["copy_GBps"], read_GBps=ceil["read_GBps"], gpu=gpu, torch=torch.__version__,
             triton=triton.__version__)
    print(f"{r['format']:34s} {r['batch']:5d} {r['q_len']:6d} {r['context']:6d} {r['ms']:8.4f} {r['TFLOPs']:8.1f}")
attention.write_csv(rows, sys.argv[1])
PY
echo "context bench after $(( $(date +%s) - start )) s"
(timeout 80 python3 -m minikv repro cross-stride --device cuda > "$OUT/repro_cross.log" 2>&1; echo "repro exit $?" >> "$OUT/repro_cross.log") &
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_kernels_gpu.py -k "context or short_queries or relative_bias" \
  > "$OUT/test-context.log" 2>&1; echo "context tests exit $?"; tail -2 "$OUT/test-context.log"
wait
tail -12 "$OUT/repro_cross.log"
echo "total $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# the driver of these calls, run from the repository root as gpu_call.sh: bash gpu_call.sh STEP...
# (abbase/prep: `git archive 3fffa02 minikv kernels`, extracted there; carry .whl from tools/pack_transformers.sh)
set -uo pipefail
R=build/rec; mkdir -p $R
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if [ ! -e /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
  touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site
ln -sfn ../kernels minikv/kernels
for d in abbase/*/; do ln -sfn ../kernels "$d/minikv/kernels"; done
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $R/calls.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $R/calls.txt
BENCH="python3 -m minikv.bench engine --device cuda --no-extras --new-tokens 16"
for step in "$@"; do
  date -u +"%F %T start $step" | tee -a $R/calls.txt
  case $step in
    blk8192)  PYTHONPATH=$PWD:/tmp/site timeout ${T:-300} $BENCH --context 8192 --contexts 8192 \
                --kv-cache-dtypes auto fp8_per_token_head fp8_per_token_head/block int8_per_token_head \
                int8_per_token_head/block fp8 --csv $R/engine_8192.csv > $R/engine_8192.txt 2>&1; rc=$?
              grep -v "it/s" $R/engine_8192.txt | tail -n 22 ;;
    blk32768) PYTHONPATH=$PWD:/tmp/site timeout ${T:-500} $BENCH --context 32768 --contexts 32768 \
                --kv-cache-dtypes auto fp8 int8_per_token_head fp8_per_token_head/block \
                --csv $R/engine_32768.csv > $R/engine_32768.txt 2>&1; rc=$?
              grep -v "it/s" $R/engine_32768.txt | tail -n 18 ;;
    blk)      PYTHONPATH=$PWD:/tmp/site timeout ${T:-560} $BENCH --context 8192 --contexts 8192 32768 \
                --kv-cache-dtypes auto fp8_per_token_head fp8_per_token_head/block int8_per_token_head \
                int8_per_token_head/block --context-formats auto fp8_per_token_head/block int8_per_token_head/block \
                --csv $R/engine_blk.csv > $R/engine_blk.txt 2>&1; rc=$?
              grep -v "it/s" $R/engine_blk.txt | tail -n 30 ;;
    prefab)   PYTHONPATH=$PWD:/tmp/site timeout ${T:-300} python3 tools/gpu_probes/prefill_ab.py abbase/prep . abbase/prep . \
                > $R/prefill_ab.txt 2>&1; rc=$?; grep -v "it/s" $R/prefill_ab.txt | tail -n 12 ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
  date -u +"%F %T end $step rc $rc" | tee -a $R/calls.txt
done
mkdir -p "${OUT:-/tmp/o}"
cp $R/calls.txt $R/*.txt $R/*.csv "${OUT:-/tmp/o}/" 2>/dev/null
ls "${OUT:-/tmp/o}"

#!/usr/bin/env bash
# the driver of the first call (`T=200 bash gpu_call.sh vsweep`), run from the repository root as gpu_call.sh with
# v-parts.patch applied; carry .whl from tools/pack_transformers.sh. The second call ran its command directly (README).
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
    ctx2048)  PYTHONPATH=$PWD:/tmp/site timeout ${T:-560} python3 -m minikv.bench engine --device cuda --new-tokens 16 \
                --context 2048 --contexts 512 2048 --eager-formats auto \
                --kv-cache-dtypes auto fp8 int8_per_token_head fp8_per_token_head fp8_per_token_head/block \
                int8_per_token_head/block --csv $R/engine_2048.csv > $R/engine_2048.txt 2>&1; rc=$?
              grep -v "it/s" $R/engine_2048.txt | tail -n 45 ;;
    vsweep)   PYTHONPATH=$PWD:/tmp/site timeout ${T:-220} python3 tools/gpu_probes/e2b_decode_sweep.py $R v-parts \
                > $R/vsweep.txt 2>&1; rc=$?; grep -v "it/s" $R/vsweep.txt | tail -n 30
              python3 tools/gpu_probes/pick_v_parts.py $R/e2b_decode_v_parts.csv > $R/v_parts.env; cat $R/v_parts.env ;;
    vab)      if [ ! -s $R/v_parts.env ]; then echo "no v_parts setting beat the default: ctx2048 instead"
                PYTHONPATH=$PWD:/tmp/site timeout ${T:-200} python3 -m minikv.bench engine --device cuda --new-tokens 16 \
                  --context 2048 --contexts 2048 --eager-formats auto --kv-cache-dtypes auto int8_per_token_head \
                  fp8_per_token_head/block --csv $R/engine_2048.csv > $R/engine_2048.txt 2>&1; rc=$?
                grep -v "it/s" $R/engine_2048.txt | tail -n 40
              else i=0; for tag in ${VAB_ORDER:-base new}; do
                i=$((i+1)); ( if [ $tag = new ]; then source $R/v_parts.env; fi; env | grep MINIKV_V_PARTS
                  PYTHONPATH=$PWD:/tmp/site timeout ${T:-120} python3 -m minikv.bench engine --device cuda --no-extras \
                  --new-tokens 16 --context 8192 --contexts 8192 --kv-cache-dtypes auto fp8 fp8_per_token_head/block \
                  int8_per_token_head/block ) > $R/vab_$tag.$i.txt 2>&1; rc=$?
                grep "replayed" $R/vab_$tag.$i.txt | cut -c1-200
                mkdir -p "${OUT:-/tmp/o}"; tar czf "${OUT:-/tmp/o}/rec.tgz" -C $R .
              done; fi ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
  date -u +"%F %T end $step rc $rc" | tee -a $R/calls.txt
  mkdir -p "${OUT:-/tmp/o}"; tar czf "${OUT:-/tmp/o}/rec.tgz" -C $R .     # after every step: a cut call keeps it
done
mkdir -p "${OUT:-/tmp/o}"
cd $R && tar czf "${OUT:-/tmp/o}/rec.tgz" . && cd - >/dev/null; cp $R/calls.txt "${OUT:-/tmp/o}/"
ls "${OUT:-/tmp/o}"

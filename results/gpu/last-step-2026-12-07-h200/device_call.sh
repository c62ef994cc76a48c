#!/usr/bin/env bash
# this session's device driver (not committed): bash gpu_call.sh STEP...
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
for step in "$@"; do
  date -u +"%F %T start $step" | tee -a $R/calls.txt
  case $step in
    last_new)  PYTHONPATH=$PWD:/tmp/site timeout ${T:-280} python3 tools/gpu_probes/last_step.py ${CTX:-32768} \
                 ${FORMATS:-auto fp8_per_token_head} > $R/last_new.txt 2>&1; rc=$?; tail -n 25 $R/last_new.txt ;;
    last_base) (cd abbase/main && PYTHONPATH=$PWD:/tmp/site timeout ${T:-280} python3 ../../tools/gpu_probes/last_step.py \
                 ${CTX:-32768} ${FORMATS:-auto fp8_per_token_head}) > $R/last_base.txt 2>&1; rc=$?; tail -n 25 $R/last_base.txt ;;
    peer_base) AB_TIMEOUT=${T:-280} bash tools/gpu_probes/engine_ab.sh base abbase/prep $R/ab --peer transformers --peer-only \
                 > $R/peer_base.log 2>&1; rc=$?; tail -n 12 $R/peer_base.log ;;
    peer_new)  AB_TIMEOUT=${T:-280} bash tools/gpu_probes/engine_ab.sh new $R/ab --peer transformers --peer-only \
                 > $R/peer_new.log 2>&1; rc=$?; tail -n 20 $R/peer_new.log ;;
    prefab)    PYTHONPATH=$PWD:/tmp/site timeout ${T:-300} python3 tools/gpu_probes/prefill_ab.py abbase/prep . abbase/prep . \
                 > $R/prefill_ab.txt 2>&1; rc=$?; grep -v "it/s" $R/prefill_ab.txt | tail -n 12 ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
  date -u +"%F %T end $step rc $rc" | tee -a $R/calls.txt
done
mkdir -p "${OUT:-/tmp/o}"
cp $R/calls.txt $R/*.txt $R/ab/*.csv $R/ab/*.txt "${OUT:-/tmp/o}/" 2>/dev/null
ls "${OUT:-/tmp/o}"

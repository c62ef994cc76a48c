#!/usr/bin/env bash
# the driver of this session's device calls (`T=... bash gpu_call.sh STEP...`), run from the repository root as
# gpu_call.sh; carry .whl from tools/pack_transformers.sh.
set -uo pipefail
R=build/rec; mkdir -p $R; i=0; j=0
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if [ ! -e /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
  touch /tmp/site/.done
fi
ln -sfn ../kernels minikv/kernels
for d in abbase/*/; do ln -sfn ../kernels "$d/minikv/kernels"; done
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $R/calls.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $R/calls.txt
for step in "$@"; do
  date -u +"%F %T start $step" | tee -a $R/calls.txt
  case $step in
    vt)   mkdir -p $R/vt${VT_RUN:-1}; PYTHONPATH=$PWD:/tmp/site timeout ${T:-240} python3 tools/gpu_probes/vt_decode_probe.py $R/vt${VT_RUN:-1} > $R/vt${VT_RUN:-1}/vt.txt 2>&1
          rc=$?; grep -v "it/s" $R/vt${VT_RUN:-1}/vt.txt | tail -n 12 ;;
    ctx)  PYTHONPATH=$PWD:/tmp/site timeout ${T:-560} python3 -m minikv.bench engine --device cuda --new-tokens 16 \
            --context 2048 --contexts 512 2048 --eager-formats auto \
            --kv-cache-dtypes auto fp8 int8_per_token_head fp8_per_token_head fp8_per_token_head/block \
            int8_per_token_head/block --csv $R/engine_512_2048.csv > $R/engine_512_2048.txt 2>&1; rc=$?
          grep -v "it/s" $R/engine_512_2048.txt | tail -n 45 ;;
    att)  PYTHONPATH=$PWD:/tmp/site timeout ${T:-300} python3 -m minikv.bench attention --batches 16 64 \
            --contexts 4096 16384 --csv $R/att.csv > $R/att.txt 2>&1; rc=$?
          grep -v "it/s" $R/att.txt | tail -n 30 ;;
    kab)  rc=0; for tree in ${KAB_ORDER:-main new main new}; do
            if [ $tree = main ]; then P=$PWD/abbase/main; else P=$PWD; fi
            TREE=$tree$((++i)) PYTHONPATH=$P:$PWD/tools/gpu_probes:/tmp/site timeout ${T:-120} python3 \
              tools/gpu_probes/vt_decode_probe.py $R/kab kernels > $R/kab_$tree$i.txt 2>&1 || rc=$?
            grep -E "default|grid" $R/kab_$tree$i.txt | head -n 60 | cut -c1-130
            mkdir -p "${OUT:-/tmp/o}"; tar czf "${OUT:-/tmp/o}/rec.tgz" -C $R .
          done ;;
    gtest) OUT=$R/gtest PYTHONPATH=$PWD:/tmp/site timeout ${T:-300} bash tools/gpu.sh tests > $R/gtest.txt 2>&1; rc=$?
          tail -n 25 $R/gtest.txt ;;
    eab)  rc=0; for tree in ${EAB_ORDER:-main new new main}; do
            if [ $tree = main ]; then P=$PWD/abbase/main; else P=$PWD; fi
            ( cd $P && PYTHONPATH=$P:/tmp/site timeout ${T:-150} python3 -m minikv.bench engine --device cuda \
              --no-extras --new-tokens 16 --context 8192 --contexts 8192 --kv-cache-dtypes auto \
              fp8_per_token_head/block int8_per_token_head/block ) > $R/eab_$tree$((++j)).txt 2>&1 || rc=$?
            grep -E "replayed|1-byte|vs bf16" $R/eab_$tree$j.txt | cut -c1-240
            mkdir -p "${OUT:-/tmp/o}"; tar czf "${OUT:-/tmp/o}/rec.tgz" -C $R .
          done ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
  date -u +"%F %T end $step rc $rc" | tee -a $R/calls.txt
  mkdir -p "${OUT:-/tmp/o}"; tar czf "${OUT:-/tmp/o}/rec.tgz" -C $R .     # after every step: a cut call keeps it
done
cp $R/calls.txt "${OUT:-/tmp/o}/"

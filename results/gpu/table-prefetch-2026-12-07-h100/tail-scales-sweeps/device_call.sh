#!/usr/bin/env bash
set -u
R=$PWD
for d in ab_head ab_tail; do ln -sfn $R/minikv/models/weights $d/minikv/models/weights; ln -sfn ../kernels $d/minikv/kernels; done
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
ls /tmp/site >/dev/null 2>&1 || { ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl; }
G=32x4x3x1,32x4x2x1
for t in head tail head tail; do (cd ab_$t && WINDOW_GRID=$G PYTHONPATH=$PWD:/tmp/site timeout 60 python3 $R/tools/gpu_probes/e2b_decode_sweep.py $OUT/sweep_$t$SECONDS row-window > $OUT/sweep_${t}_$SECONDS.txt 2>&1; echo "sweep $t exit $?"); done
for f in $OUT/sweep_*.txt; do echo "== $f"; grep -iE "head 512 window 0 (fp8|int8)|head 256 window 512 (auto|fp8_per_token_head |int8)|bf16's" $f | cut -c1-140 | head -12; done

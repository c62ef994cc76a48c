#!/usr/bin/env bash
# temporary driver for this session's device call (not committed)
set -u
R=$PWD
for d in ab_head ab_tail; do ln -sfn $R/minikv/models/weights $d/minikv/models/weights; ln -sfn ../kernels $d/minikv/kernels; done
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
GPU_TESTS="tests/test_kernels_gpu.py" OUT=$OUT/tests timeout 120 bash tools/gpu.sh tests > $OUT/gpu_tests.txt 2>&1
echo "gpu tests exit $?"; grep -E "passed|failed|FAIL" $OUT/gpu_tests.txt | tail -5
(cd ab_tail && ONLY=bench PYTHONPATH=$PWD:/tmp/site timeout 60 python3 $R/tools/gpu_probes/context_stages.py $OUT/ctx_tail > $OUT/ctx_tail.txt 2>&1; echo "ctx tail exit $?"); grep -v "^ *$" $OUT/ctx_tail.txt | tail -40
PYTHONPATH=$R:/tmp/site timeout 100 python3 tools/gpu_probes/context_stages.py $OUT/ctx_new > $OUT/ctx_new.txt 2>&1; echo "ctx new exit $?"; tail -40 $OUT/ctx_new.txt
G=${WINDOW_GRID:-32x4x3x1,32x4x2x1}
WINDOW_GRID=$G PYTHONPATH=$R:/tmp/site timeout 55 python3 tools/gpu_probes/e2b_decode_sweep.py $OUT/sweep_new row-window > $OUT/sweep_new.txt 2>&1; echo "sweep new exit $?"
for t in tail; do (cd ab_$t && WINDOW_GRID=$G PYTHONPATH=$PWD:/tmp/site timeout 55 python3 $R/tools/gpu_probes/e2b_decode_sweep.py $OUT/sweep_$t row-window > $OUT/sweep_$t.txt 2>&1; echo "sweep $t exit $?"); done
for t in new tail; do echo "== sweep $t"; grep -iE "default|best|bf16|block" $OUT/sweep_$t.txt | tail -12; done

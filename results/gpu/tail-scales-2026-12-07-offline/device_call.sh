#!/usr/bin/env bash
# temporary driver for this session's device call (not committed)
set -u
R=$PWD
for d in ab_base ab_head; do ln -sfn $R/minikv/models/weights $d/minikv/models/weights; ln -sfn ../kernels $d/minikv/kernels; done
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
GPU_TESTS="tests/test_kernels_gpu.py tests/test_decode_matmul.py" OUT=$OUT/tests bash tools/gpu.sh tests > $OUT/gpu_tests.txt 2>&1
echo "gpu tests exit $?"; grep -E "passed|failed" $OUT/gpu_tests.txt | tail -3
G=${WINDOW_GRID:-32x4x3x1,32x4x4x1,32x8x3x1,64x4x3x1}
(cd ab_head && PYTHONPATH=$PWD:/tmp/site python3 -c "import minikv; print(minikv.__file__)" && WINDOW_GRID=$G PYTHONPATH=$PWD:/tmp/site timeout 150 python3 tools/gpu_probes/e2b_decode_sweep.py $OUT/sweep_head row-window > $OUT/sweep_head.txt 2>&1; echo "sweep head exit $?")
WINDOW_GRID=$G PYTHONPATH=$R:/tmp/site timeout 150 python3 tools/gpu_probes/e2b_decode_sweep.py $OUT/sweep_new row-window > $OUT/sweep_new.txt 2>&1; echo "sweep new exit $?"
tail -25 $OUT/sweep_new.txt
[ -n "${NO_AB:-}" ] && exit 0
A="--kv-cache-dtypes auto fp8_per_token_head --contexts ${CONTEXTS:-8192} --no-extras"
bash tools/gpu_probes/engine_ab.sh base ab_base $OUT/ab $A > $OUT/ab_base.log 2>&1; echo "ab base exit $?"
bash tools/gpu_probes/engine_ab.sh new $OUT/ab $A > $OUT/ab_new.log 2>&1; echo "ab new exit $?"
tail -20 $OUT/ab_new.log

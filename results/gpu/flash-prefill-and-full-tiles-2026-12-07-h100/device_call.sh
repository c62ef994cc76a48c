#!/usr/bin/env bash
# temporary driver for this session's device call (not committed)
set -u
R=$PWD
for d in ab_head ab_full; do ln -sfn $R/minikv/models/weights $d/minikv/models/weights; ln -sfn ../kernels $d/minikv/kernels; done
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
if [ "${1:-1}" = 1 ]; then
PYTHONPATH=$R timeout 150 python3 tools/gpu_probes/flash_context.py $OUT/flash > $OUT/flash_context.txt 2>&1; echo "flash exit $?"; cat $OUT/flash_context.txt | tail -25
PYTHONPATH=$R timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_flash_prefill.py tests/test_gpu_engine.py -x > $OUT/flash_tests.txt 2>&1; echo "flash tests exit $?"; tail -15 $OUT/flash_tests.txt
PYTHONPATH=$R timeout 150 python3 tools/gpu_probes/flash_prefill_ab.py /tmp/fpab > $OUT/flash_prefill_ab.txt 2>&1; echo "prefill ab exit $?"; tail -30 $OUT/flash_prefill_ab.txt
fi
if [ "${1:-2}" = 2 ]; then
G=32x4x3x1,32x4x2x1
for t in head full head full; do (cd ab_$t && WINDOW_GRID=$G PYTHONPATH=$PWD timeout 70 python3 $R/tools/gpu_probes/e2b_decode_sweep.py $OUT/sweep_$t$SECONDS row-window > $OUT/sweep_${t}_$SECONDS.txt 2>&1; echo "sweep $t exit $?"); done
for f in $OUT/sweep_*.txt; do echo "== $f"; grep -E " default " $f | cut -c1-150 | head -12; done
GPU_TESTS="tests/test_kernels_gpu.py tests/test_decode_matmul.py" OUT=$OUT/tests timeout 200 bash ab_full/tools/gpu.sh tests > $OUT/gpu_tests_full_tiles.txt 2>&1
echo "gpu tests exit $?"; grep -E "passed|failed|FAIL|Error" $OUT/gpu_tests_full_tiles.txt | tail -8
fi

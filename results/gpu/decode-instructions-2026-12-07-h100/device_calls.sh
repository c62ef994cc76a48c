# ===== gpu_call.sh
#!/usr/bin/env bash
# temporary driver for this session's device calls (not committed)
set -u
R=$PWD
ln -sfn $R/minikv/models/weights ab_main/minikv/models/weights; ln -sfn ../kernels ab_main/minikv/kernels
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
if [ "$1" = 1 ]; then
  (cd ab_main && OUT=$OUT/stalls_main && mkdir -p $OUT && OUT=$OUT bash tools/gpu_probes/decode_stalls.sh > $OUT/run.txt 2>&1; tail -4 $OUT/run.txt)
  G=32x4x3x1
  for t in main var main var; do
    d=$R; [ $t = main ] && d=$R/ab_main
    (cd $d && WINDOW_GRID=$G PYTHONPATH=$PWD timeout 80 python3 $R/tools/gpu_probes/e2b_decode_sweep.py $OUT/sweep_${t}_$SECONDS row-window > $OUT/sweep_${t}_$SECONDS.txt 2>&1; echo "sweep $t exit $?")
  done
  for f in $OUT/sweep_*.txt; do echo "== $f"; grep -E " default |4-byte|block" $f | cut -c1-150 | head -12; done
fi
if [ "$1" = 2 ]; then
  GPU_TESTS="tests/test_kernels_gpu.py" OUT=$OUT/tests timeout 220 bash tools/gpu.sh tests > $OUT/gpu_tests_var.txt 2>&1
  echo "gpu tests exit $?"; grep -E "passed|failed|FAIL|Error|exit status" $OUT/gpu_tests_var.txt | tail -8
  for t in main var; do
    d=$R; [ $t = main ] && d=$R/ab_main
    (cd $d && PYTHONPATH=$PWD timeout 150 python3 -m minikv.bench attention --batches 64 --contexts 4096 --csv $OUT/head128_$t.csv > $OUT/head128_$t.txt 2>&1; echo "head128 $t exit $?"; tail -30 $OUT/head128_$t.txt)
  done
fi
# ===== gpu_call2.sh
#!/usr/bin/env bash
set -u
R=$PWD
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
for v in main min uns lazy; do ln -sfn $R/minikv/models/weights ab_$v/minikv/models/weights; ln -sfn ../kernels ab_$v/minikv/kernels; done
G=32x4x3x1
for round in 1 2; do for t in main min uns lazy; do
  (cd $R/ab_$t && WINDOW_GRID=$G PYTHONPATH=$PWD timeout 80 python3 $R/tools/gpu_probes/e2b_decode_sweep.py $OUT/s_${t}_$round row-window > $OUT/s_${t}_$round.txt 2>&1; echo "sweep $t exit $?")
done; done
for f in $OUT/s_*.txt; do echo "== $f"; grep -E " default " $f | cut -c1-60 | sed 's/ *: default//' | tr '\n' ' '; echo; done
# ===== gpu_call3.sh
#!/usr/bin/env bash
set -u
R=$PWD
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
ln -sfn $R/minikv/models/weights ab_main/minikv/models/weights; ln -sfn ../kernels ab_main/minikv/kernels
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
if [ "$1" = occ ]; then
  PYTHONPATH=$R timeout 560 python3 tools/gpu_probes/decode_occupancy.py $OUT/occupancy 128 512 > $OUT/occupancy.txt 2>&1; echo "occ exit $?"
  cat $OUT/occupancy.txt | grep -v "^ *$" | tail -90
fi
if [ "$1" = engine ]; then
  for t in main var; do
    d=$R; [ $t = main ] && d=$R/ab_main
    (cd $d && PYTHONPATH=$PWD timeout 280 python3 -m minikv.bench engine --device cuda --kv-cache-dtypes auto fp8 int8_per_token_head fp8_per_token_head --contexts 8192 --no-extras > $OUT/engine_$t.txt 2>&1; echo "engine $t exit $?"; grep -E "ctx=8192|MISSED|met " $OUT/engine_$t.txt | cut -c1-200)
  done
fi
# ===== gpu_call4.sh
#!/usr/bin/env bash
set -u
R=$PWD
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
ln -sfn $R/minikv/models/weights ab_main/minikv/models/weights; ln -sfn ../kernels ab_main/minikv/kernels
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
if [ "$1" = bench ]; then
  GPU_TESTS="tests/test_kernels_gpu.py" OUT=$OUT/tests timeout 200 bash tools/gpu.sh tests > $OUT/gpu_tests.txt 2>&1
  echo "gpu tests exit $?"; grep -E "passed|failed|FAIL|Error|exit status" $OUT/gpu_tests.txt | tail -8
  for t in main var; do
    d=$R; [ $t = main ] && d=$R/ab_main
    (cd $d && PYTHONPATH=$PWD timeout 120 python3 -m minikv.bench attention --batches 1 16 64 256 --contexts 4096 16384 --csv $OUT/att_${t}_$SECONDS.csv > $OUT/att_${t}_$SECONDS.txt 2>&1; echo "att $t exit $?")
  done
  for f in $OUT/att_*.txt; do echo "== $f"; grep -E "per_token_head vs bf16|fp8 vs bf16" $f | cut -c1-140; done
fi
if [ "$1" = engine ]; then
  for t in main var; do
    d=$R; [ $t = main ] && d=$R/ab_main
    (cd $d && PYTHONPATH=$PWD timeout 280 python3 -m minikv.bench engine --device cuda --kv-cache-dtypes auto fp8 int8_per_token_head fp8_per_token_head --contexts 8192 --no-extras > $OUT/engine_$t.txt 2>&1; echo "engine $t exit $?"; grep -E "ctx=8192|MISSED|met " $OUT/engine_$t.txt | cut -c1-200)
  done
fi

# ===== gpu_call.sh (call 1: 'GPU_TESTS="tests/test_rms_norm.py tests/test_decode_matmul.py" TEST_T=150 bash gpu_call.sh ab';
# call 2: GPU_TESTS="tests/test_gpu_graphs.py tests/test_gpu_engine.py tests/test_parity_gpu.py tests/test_kernel_mode.py" bash gpu_call.sh none;
# call 3: TREES="new main" CTXS=8192 ENG_T=110 GPU_TESTS=tests/test_rms_norm.py TEST_T=90 bash gpu_call.sh ab)
#!/usr/bin/env bash
# temporary driver for this session's device calls (not committed)
set -u
R=$PWD
ln -sfn $R/minikv/models/weights ab_main/minikv/models/weights; ln -sfn ../kernels ab_main/minikv/kernels
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
if [ "$1" = ab ]; then
  for t in ${TREES:-main new main new}; do
    d=$R; [ $t = main ] && d=$R/ab_main
    (cd $d && PYTHONPATH=$PWD timeout ${ENG_T:-150} python3 -m minikv.bench engine --device cuda --kv-cache-dtypes ${FMTS:-auto fp8_per_token_head} --contexts ${CTXS:-2048} --no-extras > $OUT/engine_${t}_$SECONDS.txt 2>&1; echo "engine $t exit $? at $SECONDS s")
  done
  for f in $OUT/engine_*.txt; do echo "== $f"; head -1 $f | cut -c1-100; grep -E "ctx=" $f | sed -E 's/decode tokens.s \(//; s/prefill.*//; s/replayed//' | cut -c1-150; done
fi
if [ -n "${GPU_TESTS:-}" ]; then
  OUT=$OUT/tests timeout ${TEST_T:-300} bash tools/gpu.sh tests > $OUT/gpu_tests.txt 2>&1
  echo "gpu tests exit $? at $SECONDS s"; grep -E "passed|failed|FAIL|Error|exit status" $OUT/gpu_tests.txt | tail -12
fi

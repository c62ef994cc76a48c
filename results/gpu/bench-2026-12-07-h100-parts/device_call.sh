#!/usr/bin/env bash
# this session's device driver (not committed): bash gpu_call.sh STEP...
set -uo pipefail
mkdir -p build/rec
[ -e build/rec/gpu_attention.csv ] || cp notebooks/data/gpu_attention.csv build/rec/gpu_attention.csv
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a build/rec/calls.txt
for step in "$@"; do
  date -u +"%F %T start $step" | tee -a build/rec/calls.txt
  case $step in
    tests) GPU_TESTS="${GPU_TESTS:-tests/test_parity_gpu.py tests/test_gpu_graphs.py tests/test_gpu_engine.py}" \
             OUT=build/rec/t timeout ${TT:-300} bash tools/gpu.sh tests > build/rec/tests.txt 2>&1; rc=$?
           tail -n 40 build/rec/tests.txt ;;
    peer)  OUT=build/rec/p CSV=build/rec/gpu_attention.csv BENCH_PART=engine BENCH_TIMEOUT=${T:-300} \
             ENGINE_ARGS="--peer transformers --peer-only" bash tools/gpu.sh bench > build/rec/peer.txt 2>&1; rc=$?
           tail -n 30 build/rec/peer.txt ;;
    long)  OUT=build/rec/l CSV=build/rec/gpu_attention.csv BENCH_PART=engine BENCH_TIMEOUT=${T:-540} \
             ENGINE_ARGS="${LONG_ARGS:---context 32768 --contexts 32768 --no-extras}" bash tools/gpu.sh bench \
             > build/rec/long.txt 2>&1; rc=$?
           tail -n 30 build/rec/long.txt ;;
    cap)   OUT=build/rec/c CSV=build/rec/gpu_attention.csv BENCH_PART=engine BENCH_TIMEOUT=${T:-540} \
             ENGINE_ARGS="${CAP_ARGS:---capacity-only}" bash tools/gpu.sh bench \
             > build/rec/cap.txt 2>&1; rc=$?
           tail -n 30 build/rec/cap.txt ;;
    prof)  timeout ${T:-120} python3 -m minikv.bench engine --device cuda --kv-cache-dtypes auto fp8_per_token_head \
             --context 8192 --contexts 8192 --no-extras --profile > build/rec/prof.txt 2>&1; rc=$?
           tail -n 45 build/rec/prof.txt ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
  date -u +"%F %T end $step rc $rc" | tee -a build/rec/calls.txt
done
mkdir -p "${OUT:-/tmp/o}"
cp build/rec/gpu_attention.csv build/rec/calls.txt build/rec/*.txt "${OUT:-/tmp/o}/" 2>/dev/null
ls "${OUT:-/tmp/o}"

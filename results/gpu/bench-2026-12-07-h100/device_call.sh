#!/usr/bin/env bash
# The device driver of this folder's calls: `bash device_call.sh all|kernels|engine` from the repo root (T: the
# bench's time limit; ENGINE_ARGS: the engine part's arguments)
set -uo pipefail
part=$1
mkdir -p build/rec
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a build/rec/calls.txt
date -u +"%F %T start $part" | tee -a build/rec/calls.txt
case $part in
  all|kernels) CSV=build/rec/gpu_attention.csv BENCH_PART=$part ENGINE_ARGS="${ENGINE_ARGS:-}" BENCH_TIMEOUT=${T:-480} bash tools/gpu.sh bench ;;
  engine)  CSV=build/rec/gpu_attention.csv BENCH_PART=engine BENCH_TIMEOUT=${T:-540} ENGINE_ARGS="$ENGINE_ARGS" \
             bash tools/gpu.sh bench ;;
esac
rc=$?
date -u +"%F %T end $part rc $rc" | tee -a build/rec/calls.txt
cp build/rec/gpu_attention.csv* build/rec/calls.txt "$OUT/" 2>/dev/null
mv "$OUT/bench.txt" "$OUT/bench_$part${TAG:-}.txt" 2>/dev/null
exit $rc

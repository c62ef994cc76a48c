# bash tools/gpu_probes/recorded_run.sh STEP... (repository root, CUDA machine, .whl/ carried): tools/gpu.sh's steps
# (`bench`: the recorded run: kernels, FlashInfer, the engine; `tests`: `make test-gpu`'s steps from an empty
# Triton cache); the files kept are copied to $OUT (at most 8 come back from the device)
G=/tmp/gpu-recorded-run
rm -rf $G; mkdir -p $G
OUT=$G TRITON_CACHE_DIR=fresh bash tools/gpu.sh "$@" > $G/all.txt 2>&1
echo "gpu.sh exit $?"
for f in env.txt tests.log bench.txt gpu_attention.csv; do [ -e $G/$f ] && cp $G/$f $OUT/; done
tar czf $OUT/logs-$1.tgz -C $G . 2>/dev/null
[ -e $G/tests.log ] && grep -E "passed|failed|make test-gpu|exit status" $G/tests.log | tail -6
[ -e $G/bench.txt ] && grep -E "met|MISSED|report" $G/bench.txt | tail -60

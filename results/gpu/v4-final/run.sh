# bash results/gpu/v4-final/run.sh (repository root, CUDA machine, .whl/ carried): `make test-gpu`'s steps from an
# empty Triton cache, then the recorded run (tools/gpu.sh bench: kernels, FlashInfer, the engine); the files
# kept are copied to $OUT (at most 8 come back from the device)
G=/tmp/gpu-final
rm -rf $G; mkdir -p $G
OUT=$G TRITON_CACHE_DIR=fresh bash tools/gpu.sh tests bench > $G/all.txt 2>&1
echo "gpu.sh exit $?"
cp $G/env.txt $G/tests.log $G/bench.txt $G/gpu_attention.csv $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $G . 2>/dev/null
grep -E "passed|failed|make test-gpu|exit status" $G/tests.log | tail -6
grep -E "met|MISSED|report" $G/bench.txt | tail -60

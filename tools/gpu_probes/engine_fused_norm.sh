# bash tools/gpu_probes/engine_fused_norm.sh (repository root, CUDA machine; OUT: where the results go): the engine
# bench, the per-step profile and make test-gpu with the fused RMSNorm kernel (results/gpu/engine-fused-norm/)
set -o pipefail
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
mkdir -p $OUT
timeout 250 python3 -m minikv.bench engine --device cuda --contexts 2048 8192 --eager-formats auto --csv $OUT/engine.csv 2>&1 | grep -v "^USDT\|STAGE:" > $OUT/engine.txt
echo "engine exit $?"; grep -i "met\|MISSED\|report" $OUT/engine.txt
FORMATS="auto int8_per_token_head" timeout 90 python3 tools/gpu_probes/engine_step_profile.py steps $OUT 2>&1 | grep -v "^USDT\|STAGE:\|Warn\|_warn" > $OUT/steps_fused.txt
grep "per step" -A6 $OUT/steps_fused.txt | grep -v top
OUT=/tmp/t TRITON_CACHE_DIR=fresh timeout 230 bash tools/gpu.sh tests > $OUT/tests.txt 2>&1; echo "tests exit $?"
grep -E "passed|failed|FAILED|Error|make test-gpu" $OUT/tests.txt | tail -15

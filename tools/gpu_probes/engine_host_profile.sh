# the host side of an engine decode step at context 8192 (cProfile), and the fused-norm GPU tests after the
# tolerance fix: bash tools/gpu_probes/engine_host_profile.sh (repository root, CUDA machine)
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
timeout 200 python3 -m minikv.bench engine --device cuda --context 8192 --contexts 8192 --kv-cache-dtypes auto \
  --no-extras --profile --new-tokens 48 2>&1 | grep -v "^USDT\|STAGE:" > $OUT/host_profile.txt
echo "profile exit $?"; head -c 9000 $OUT/host_profile.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_rms_norm.py > $OUT/test_rms_norm.txt 2>&1
echo "tests exit $?"; tail -3 $OUT/test_rms_norm.txt

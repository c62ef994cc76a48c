# bash tools/gpu_probes/decode_profile.sh (repository root, CUDA machine; OUT: where the results go)
# 1. where an engine step's GPU time goes (torch.profiler, eager, gemma-4-E2B dims, batch 64, context 8192)
# 2. decode launch configurations at the E2B attention shapes (e2b_decode_sweep.csv)
# 3. Nsight Compute on those decode kernels with the configurations launch.py now picks
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
HERE=tools/gpu_probes
python3 -c "import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)" | tee $OUT/env.txt
git log -1 --format='commit %H (plus the working tree)' >> $OUT/env.txt 2>/dev/null
timeout ${STEPS_TIMEOUT:-230} python3 $HERE/engine_step_profile.py steps $OUT 2>&1 | grep -v "^USDT\|STAGE:" | tee $OUT/steps.txt
timeout ${SWEEP_TIMEOUT:-250} python3 $HERE/e2b_decode_sweep.py $OUT 2>&1 | tee $OUT/sweep.txt
NCU="/usr/local/cuda/bin/ncu --clock-control none --csv --page details --section SpeedOfLight --section LaunchStats
     --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
timeout ${NCU_TIMEOUT:-80} $NCU -k regex:"decode_kernel|merge" python3 $HERE/engine_step_profile.py kernels > $OUT/ncu_e2b.csv \
  2> $OUT/ncu_e2b.err
echo "ncu e2b exit $?"
python3 -m minikv.bench.profile_decode summarize $OUT/ncu_e2b.csv > $OUT/ncu_e2b_summary.txt 2>&1
head -c 3000 $OUT/ncu_e2b_summary.txt

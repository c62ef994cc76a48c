# bash tools/gpu_probes/decode_stalls.sh (repository root, CUDA machine; OUT: where the results go): why the decode
# kernel's warps wait, at gemma-4-E2B's full layer (8 query heads over 1 KV head of 512, batch 64, context 8192) in
# bf16, fp8 per-token-head "row" and "block": Nsight Compute's share of each stall reason per active warp, beside
# the kernel's duration, DRAM throughput, active warps and instructions (decode_stalls.txt). Written on 2026-12-07 for
# issue 37's 1-byte target and not yet run: that session's device time ran out first.
export PYTHONPATH=$PWD TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
python3 -c "import torch, triton; print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)" | tee $OUT/env.txt
REASONS="long_scoreboard short_scoreboard wait barrier mio_throttle lg_throttle math_pipe_throttle not_selected selected
         no_instruction dispatch_stall drain membar branch_resolving imc_miss tex_throttle sleeping misc"
METRICS=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
for r in $REASONS; do METRICS=$METRICS,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
# each (format, shape) launches twice, the first compiling: launches 1, 3, 5 are bf16, fp8pth row and block at head 512
FORMATS="auto fp8_per_token_head fp8_per_token_head/block" timeout 150 /usr/local/cuda/bin/ncu --clock-control none \
  --csv --page raw -k regex:decode_kernel --launch-count 6 --metrics $METRICS \
  python3 tools/gpu_probes/engine_step_profile.py kernels > $OUT/decode_stalls.csv 2> $OUT/decode_stalls.err
echo "ncu exit $?"
python3 - <<'PY' | tee $OUT/decode_stalls.txt
import csv, os
rows = [r for r in csv.DictReader(l for l in open(os.path.join(os.environ["OUT"], "decode_stalls.csv")) if l.startswith('"'))]
for r in rows[1:]:          # the first row of --page raw is the units
    stalls = {k.split("stalled_")[1].split("_per_issue")[0]: float(v.replace(",", "") or 0)
              for k, v in r.items() if "issue_stalled_" in k and "per_issue_active" in k}
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:6]
    print(f"launch {r['ID']}: {float(r['gpu__time_duration.sum'].replace(',', '')) / 1e3:.1f} us, DRAM "
          f"{r['dram__throughput.avg.pct_of_peak_sustained_elapsed']}%, warps active "
          f"{r['sm__warps_active.avg.pct_of_peak_sustained_active']}%, instructions {r['smsp__inst_executed.sum']}; "
          "cycles stalled per issue: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
PY

# bash tools/gpu_probes/ncu_attention.sh (repository root, CUDA machine; OUT: where the results go): Nsight Compute
# on minikv's bf16 paged decode and causal context kernels next to torch SDPA (results/gpu/ncu-decode-context/)
export PYTHONPATH=$PWD TQDM_DISABLE=1
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
python3 tools/gpu_probes/ncu_attention_launch.py decode && python3 tools/gpu_probes/ncu_attention_launch.py context || exit 1
for w in decode context; do
  timeout 120 /usr/local/cuda/bin/ncu --clock-control none -k regex:"decode|merge|context|flash|fmha|attention|cudnn|sdpa|efficient" --launch-count 8 --section SpeedOfLight \
    --section LaunchStats --section Occupancy --csv --page details python3 tools/gpu_probes/ncu_attention_launch.py $w > $OUT/ncu_$w.csv 2> $OUT/ncu_$w.err
  echo "ncu $w exit $?"
done
python3 - <<'PY'
import csv, os, collections
for w in ("decode", "context"):
    rows = list(csv.DictReader(open(os.path.join(os.environ["OUT"], f"ncu_{w}.csv")))) if os.path.getsize(os.path.join(os.environ["OUT"], f"ncu_{w}.csv")) else []
    by = collections.OrderedDict()
    for r in rows:
        by.setdefault((r.get("ID"), r.get("Kernel Name", "")[:60]), {})[r.get("Metric Name")] = r.get("Metric Value")
    for (i, k), m in by.items():
        keep = {n: m[n] for n in m if n in ("Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput", "Registers Per Thread", "Achieved Occupancy", "Theoretical Occupancy", "Grid Size", "Block Size", "Dynamic Shared Memory Per Block")}
        print(w, i, k, keep)
PY

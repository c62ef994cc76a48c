"""Run the paged decode kernel twice per format at batch 64 / context 4096 (for ncu), or summarize ncu's CSV.

    ncu ... python3 tools/profile_decode.py BEST_JSON     (the sweep's best.json; configs of stage B's b64/4096)
    python3 tools/profile_decode.py --summarize NCU_CSV
"""
import csv
import json
import sys

METRICS = {"Duration": "duration", "Registers Per Thread": "regs", "Achieved Occupancy": "occupancy %",
           "DRAM Throughput": "DRAM %", "Memory Throughput": "mem GB/s or %", "Grid Size": "grid",
           "Block Size": "threads", "Theoretical Occupancy": "theor. occ %", "L1/TEX Hit Rate": "L1 hit %",
           "L2 Hit Rate": "L2 hit %", "Mem Busy": "mem busy %", "Max Bandwidth": "max bw %"}


def summarize(path):
    rows = list(csv.DictReader(line for line in open(path) if line.startswith('"')))
    by_launch = {}
    for r in rows:
        by_launch.setdefault(r["ID"], {})[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
    for launch, m in by_launch.items():
        print(f"launch {launch}: " + "; ".join(f"{short}={m[k]}" for k, short in METRICS.items() if k in m))


def run(best_path):
    import torch
    from minikv.kernels.launch import DecodeConfig

    from minikv.bench import attention_sweep as sw
    try:
        best = json.load(open(best_path))["decode"]
    except Exception:  # noqa: BLE001 - no sweep result: the committed tables
        best = {}
    for fmt in sw.FORMATS:
        key = f"{sw.FAMILY[fmt]}|{fmt}|64|4096"
        problem = sw._decode_problem(fmt, 64, 4096)
        if key in best:
            block_n, warps, stages, splits, prefetch, words, f16 = best[key][1]
            sw._pinned_decode(DecodeConfig(16, block_n, splits, warps, stages, prefetch, words, f16))
        print(fmt, best.get(key), file=sys.stderr)
        for _ in range(2):
            sw._decode_call(problem)()
        torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "--summarize":
        summarize(sys.argv[2])
    else:
        run(sys.argv[1])

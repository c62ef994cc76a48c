"""Run the paged decode kernel at batch 64 / context 4096 for Nsight Compute, or summarize ncu's CSV.

    ncu --clock-control none -k regex:decode_kernel --csv --page details [--section ...] \\
        python3 tools/profile_decode.py run [BEST_JSON]      (gpu_probe.py's best.json: each format's best variant)
    python3 tools/profile_decode.py summarize NCU_CSV

`run` launches each format's kernel twice (the first launch compiles), so ncu sees two launches per format; the
variant names are gpu_probe.py's.
"""
import csv
import json
import sys

FORMATS = ("auto", "fp8", "int8_per_token_head", "int8_per_token_head/block", "fp8_per_token_head",
           "fp8_per_token_head/block")
METRICS = {"Duration": "us", "Registers Per Thread": "regs", "Shared Memory Configuration Size": "smem cfg",
           "Dynamic Shared Memory Per Block": "dyn smem/block", "Theoretical Occupancy": "theor occ %",
           "Achieved Occupancy": "occ %", "DRAM Throughput": "DRAM %", "Memory Throughput": "mem %",
           "L1/TEX Hit Rate": "L1 hit %", "L2 Hit Rate": "L2 hit %", "Mem Busy": "mem busy %",
           "Max Bandwidth": "max bw %", "Issue Slots Busy": "issue %", "Grid Size": "grid",
           "Block Size": "threads", "Waves Per SM": "waves", "Warp Cycles Per Issued Instruction": "cyc/issue",
           "Block Limit Registers": "lim regs", "Block Limit Shared Mem": "lim smem"}


def summarize(path):
    rows = list(csv.DictReader(line for line in open(path) if line.startswith('"')))
    by_launch, names = {}, {}
    for r in rows:
        by_launch.setdefault(r["ID"], {})[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
        names[r["ID"]] = r.get("Kernel Name", "")
    for launch, m in by_launch.items():
        print(f"launch {launch} {names[launch][:40]}: " + "; ".join(
            f"{short}={m[k]}" for k, short in METRICS.items() if k in m))
        stalls = sorted(((k, v) for k, v in m.items() if k.startswith("Stall")), key=lambda kv: -_num(kv[1]))[:5]
        if stalls:
            print("    top stalls: " + "; ".join(f"{k}={v}" for k, v in stalls))


def _num(text):
    try:
        return float(text.split()[0].replace(",", ""))
    except (ValueError, IndexError):
        return 0.0


def run(best_path=None):
    import torch

    sys.path.insert(0, "tools")
    import gpu_probe as gp
    import minikv.kernels as kernels
    from minikv.kernels import launch
    best = json.load(open(best_path)) if best_path else {}
    for fmt in FORMATS:
        name = best.get(f"{fmt}|64|4096", "default")
        v = {**gp.VARIANTS_ONE_BYTE, **gp.VARIANTS_AUTO, **gp.SPLIT_VARIANTS}.get(name, {})
        kw, overrides = {}, v
        if isinstance(v, str):
            key, value = v.split("=")
            kw[key] = float(value) if key == "waves" else int(value)
            overrides = {}
        prob = gp.Problem(fmt, 64, 4096)
        restore = gp.patched(launch, overrides, **kw)
        try:
            print(fmt, name, file=sys.stderr, flush=True)
            for _ in range(2):
                prob.call(kernels)()
            torch.cuda.synchronize()
        finally:
            restore()
        del prob
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1] == "summarize":
        summarize(sys.argv[2])
    else:
        run(sys.argv[2] if len(sys.argv) > 2 else None)

"""Run the paged decode kernel at batch 64 / context 4096 for Nsight Compute, or summarize ncu's CSV.
See docs/internals.md#bench-profile-decode."""
import csv
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


def run(formats=FORMATS):
    import dataclasses

    import torch

    from minikv.bench.attention import HKV, HQ, D, decode_problem
    from minikv.kernels import launch, paged_decode_attention
    for fmt in formats:
        layout, pool, tables, lens, q, out = decode_problem(fmt, 64, 4096)
        cfg = launch.decode_config(64, HKV, HQ // HKV, D, layout.elem_bytes, 4096, q.device, fmt=layout.fmt,
                                   placement=layout.placement)
        variants = [cfg] + ([dataclasses.replace(cfg, row_window=False)]
                            if layout.has_inline_scales and layout.scale_placement == "row" else [])
        for variant in variants:
            print(fmt, variant, file=sys.stderr, flush=True)
            for _ in range(2):
                paged_decode_attention(q, pool, tables, lens, layout, D ** -0.5, out=out, validate=False,
                                       config=variant)
            torch.cuda.synchronize()
        del pool
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1] == "summarize":
        summarize(sys.argv[2])
    else:
        run(sys.argv[2:] or FORMATS)

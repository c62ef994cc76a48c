"""notebooks/data/gpu_engine_qkv_ab.csv from round 1's two engine-bench logs (the bench ran without --csv): per
tree, format and context, the median step and the graph replay the bench printed (ms, two decimals).

    python results/gpu/qkv-launch-2026-12-07-h100/ab_csv.py
"""
import csv
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[2] / "notebooks" / "data" / "gpu_engine_qkv_ab.csv"
TREES = {"round1_main.txt": "e5a639c (q, then k with v, then three norms)",
         "round1_new.txt": "q, k and v in one matmul and one norm"}
ROW = re.compile(r"^\s+(\S+)\s+B=(\d+)\s+ctx=(\d+).*graph replay alone\s+([\d.]+) ms.*median ([\d.]+)")

rows = [dict(tree=tree, format=m[1], batch=m[2], context=m[3], step_ms=m[5], graph_replay_ms=m[4])
        for name, tree in TREES.items() for m in map(ROW.match, open(HERE / "ab" / name)) if m]
with open(OUT, "w", newline="") as f:
    writer = csv.DictWriter(f, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
print(f"wrote {len(rows)} rows to {OUT}")

"""The ratios of an A/B of the engine bench: the working tree's rows over the baseline's, matched by what they ran.

    python tools/gpu_probes/ab_ratios.py OUT/base.csv OUT/new.csv

engine_ab.sh runs it after the working tree's run when the baseline's CSV is beside it. Above 1: the working tree
is faster (tokens/s: new / base; milliseconds: base / new).
"""
import csv
import sys

KEY = ("format", "batch", "context", "mode", "engine")
FASTER_WHEN_HIGHER = ("prefill_tokens_per_s", "decode_tokens_per_s")
FASTER_WHEN_LOWER = ("step_ms", "graph_replay_ms")


def ratios(base_rows, new_rows):
    """[(key, {column: new-over-base speed})] for every row of `new_rows` with a match in `base_rows`."""
    base = {tuple(r.get(k, "") for k in KEY): r for r in base_rows}
    out = []
    for r in new_rows:
        b = base.get(tuple(r.get(k, "") for k in KEY))
        if b is None:
            continue
        speed = {}
        for col in FASTER_WHEN_HIGHER + FASTER_WHEN_LOWER:
            if r.get(col) and b.get(col):
                new, old = float(r[col]), float(b[col])
                speed[col] = new / old if col in FASTER_WHEN_HIGHER else old / new
        out.append((tuple(r.get(k, "") for k in KEY), speed))
    return out


def main(base_csv, new_csv):
    with open(base_csv) as f:
        base_rows = list(csv.DictReader(f))
    with open(new_csv) as f:
        new_rows = list(csv.DictReader(f))
    print(f"A/B, working tree over baseline (above 1: faster), {base_csv} -> {new_csv}")
    for key, speed in ratios(base_rows, new_rows):
        cells = "  ".join(f"{col} {value:.3f}x" for col, value in speed.items())
        print(f"  {' '.join(k for k in key if k)}: {cells}")


if __name__ == "__main__":
    main(*sys.argv[1:3])

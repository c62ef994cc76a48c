"""Time two versions of the paged decode kernel side by side on a GPU: the working tree's and an earlier one.

    git show REV:kernels/decode_attention.py > /tmp/decode_before.py
    python tools/decode_ab.py /tmp/decode_before.py [--rounds 3] [--csv out.csv]

Each case (format, batch, context; the bench's head 128 shapes and gemma-4-E2B's heads of 256 and 512) builds one
problem and times both versions on it in alternating rounds (CUDA graphs, L2 flushed, 20 replays each); a row gives
each version's median over the rounds, its spread (min and max of the rounds) and the ratio before / after.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import statistics
import sys

import torch


def load_before(path: str):
    """The earlier decode_attention module, imported inside minikv.kernels (its relative imports resolve there)."""
    import minikv.kernels  # noqa: F401
    spec = importlib.util.spec_from_file_location("minikv.kernels.decode_attention_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def problem(fmt: str, batch: int, ctx: int, heads: tuple[int, int], head_size: int):
    from minikv.bench.attention import BS, fill_pool
    from minikv.cache.layout import KVLayout
    kv_cache_dtype, _, placement = fmt.partition("/")
    layout = KVLayout(kv_cache_dtype, torch.bfloat16, heads[1], head_size, BS, placement or "row")
    num_blocks = batch * ctx // BS
    pool = torch.empty(num_blocks, layout.block_bytes, dtype=torch.uint8, device="cuda")
    fill_pool(pool, layout)
    tables = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, ctx // BS)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, heads[0], head_size, dtype=torch.bfloat16, device="cuda")
    return layout, pool, tables, lens, q


FORMATS = ("auto", "fp8", "fp8_per_token_head", "int8_per_token_head", "fp8_per_token_head/block",
           "int8_per_token_head/block")
SHAPES = [((32, 8), 128, b, c) for b, c in ((16, 4096), (64, 512), (64, 4096))]
SHAPES += [((8, 1), 256, 64, 2048), ((8, 1), 512, 64, 8192)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="the earlier kernels/decode_attention.py")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--csv", default=None)
    args = p.parse_args(argv)
    from minikv.bench.timing import time_ms
    from minikv.kernels import decode_attention as after
    before = load_before(args.before)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; before = {args.before}")
    print(f"{'format':26s} {'heads':>5s} {'D':>4s} {'batch':>5s} {'ctx':>6s}  {'before us (min-max)':>22s}  "
          f"{'after us (min-max)':>22s}  before/after")
    rows = []
    for heads, head_size, batch, ctx in SHAPES:
        for fmt in FORMATS:
            layout, pool, tables, lens, q = problem(fmt, batch, ctx, heads, head_size)
            out = torch.empty_like(q)
            sm = head_size ** -0.5
            times = {"before": [], "after": []}
            for _ in range(args.rounds):
                for name, module in (("before", before), ("after", after)):
                    times[name].append(1e3 * time_ms(lambda m=module: m.paged_decode_attention(
                        q, pool, tables, lens, layout, sm, out=out, validate=False), "cuda", graph=True).ms)
            row = {"format": fmt, "heads": f"{heads[0]}/{heads[1]}", "head_size": head_size, "batch": batch,
                   "context": ctx}
            for name, ts in times.items():
                row.update({f"{name}_us": statistics.median(ts), f"{name}_min_us": min(ts),
                            f"{name}_max_us": max(ts)})
            row["before_over_after"] = row["before_us"] / row["after_us"]
            rows.append(row)
            print(f"{fmt:26s} {row['heads']:>5s} {head_size:4d} {batch:5d} {ctx:6d}  "
                  f"{row['before_us']:8.1f} ({row['before_min_us']:6.1f}-{row['before_max_us']:6.1f})  "
                  f"{row['after_us']:8.1f} ({row['after_min_us']:6.1f}-{row['after_max_us']:6.1f})  "
                  f"{row['before_over_after']:.3f}", flush=True)
            del pool
            torch.cuda.empty_cache()
    ratios = [r["before_over_after"] for r in rows]
    print(f"before/after over {len(rows)} cases: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
          f"max {max(ratios):.3f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

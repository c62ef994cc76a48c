"""Time two versions of the paged decode kernel side by side on a GPU: the working tree's and an earlier one.

    git show REV:kernels/decode_attention.py > /tmp/decode_before.py
    python tools/decode_ab.py /tmp/decode_before.py [--rounds 3] [--csv out.csv]

Each case (format, batch, context; the bench's head 128 shapes and gemma-4-E2B's heads of 256 and 512) builds one
problem and times both versions on it in alternating rounds (CUDA graphs, L2 flushed, 20 replays each); a row gives
each version's median over the rounds, its spread (min and max of the rounds) and the ratio before / after.
--neighbours: for every case where the working tree's kernel is slower beyond both spreads, time it again under
launch configurations next to its own (stages, warps, tile length, conversion placement), alternating with the
earlier version, and print the fastest, to show whether a table entry recovers the case.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
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


def alternate(versions: dict, rounds: int, problem_args) -> dict[str, list[float]]:
    """Microseconds per call of each (module, config) in `versions`, `rounds` times, one after the other."""
    from minikv.bench.timing import time_ms
    q, pool, tables, lens, layout, sm, out = problem_args
    times = {name: [] for name in versions}
    for _ in range(rounds):
        for name, (module, config) in versions.items():
            times[name].append(1e3 * time_ms(lambda m=module, c=config: m.paged_decode_attention(
                q, pool, tables, lens, layout, sm, out=out, validate=False, config=c), "cuda", graph=True).ms)
    return times


def retime_neighbours(before, after, rounds: int, problem_args, batch: int, ctx: int) -> None:
    from minikv.kernels import launch
    q, _, _, _, layout, _, _ = problem_args
    spec = layout.spec
    own = launch.decode_config(batch, spec.num_kv_heads, q.shape[1] // spec.num_kv_heads, spec.head_size,
                               spec.elem_bytes, ctx, q.device, fmt=spec.fmt, placement=spec.placement)
    variants = {"own": own}
    for stages in (2, 3, 4, 5, 6):
        variants[f"stages={stages}"] = dataclasses.replace(own, num_stages=stages)
    variants["warps=8"] = dataclasses.replace(own, num_warps=8)
    for block_n in (own.block_n // 2, own.block_n * 2):
        if block_n >= 16:
            splits = launch.decode_splits(batch, spec.num_kv_heads, ctx, block_n, launch.num_sms())
            variants[f"block_n={block_n},splits={splits}"] = dataclasses.replace(own, block_n=block_n,
                                                                                num_splits=splits)
    variants["splits/2"] = dataclasses.replace(own, num_splits=max(1, own.num_splits // 2))
    variants["splits*2"] = dataclasses.replace(own, num_splits=own.num_splits * 2)
    variants["k_pure flipped"] = dataclasses.replace(own, k_pure=not own.k_pure)
    variants["v_pure flipped"] = dataclasses.replace(own, v_pure=not own.v_pure)
    versions = {"before": (before, None), **{name: (after, cfg) for name, cfg in variants.items()}}
    times = alternate(versions, rounds, problem_args)
    base = statistics.median(times["before"])
    print(f"    own config: {own}")
    for name, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"    {name:28s} {statistics.median(ts):8.1f} us ({min(ts):6.1f}-{max(ts):6.1f})  "
              f"before/this {base / statistics.median(ts):.3f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="the earlier kernels/decode_attention.py")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--csv", default=None)
    p.add_argument("--neighbours", action="store_true", help="retime slower cases under nearby launch configs")
    args = p.parse_args(argv)
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
            times = alternate({"before": (before, None), "after": (after, None)}, args.rounds,
                              (q, pool, tables, lens, layout, sm, out))
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
            if args.neighbours and row["after_min_us"] > row["before_max_us"]:
                retime_neighbours(before, after, args.rounds, (q, pool, tables, lens, layout, sm, out), batch, ctx)
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

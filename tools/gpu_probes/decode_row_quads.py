"""Probe for the "row" placement read four kv heads at a time (decode_attention._decode_row_quads_kernel), H200.

    python tools/gpu_probes/decode_row_quads.py OUT_DIR

1. Every candidate launch configuration compiled first, in parallel processes.
2. Each candidate checked against the torch reference (batch 3, 32 / 8 heads, head size 128, ragged lengths).
3. Timings (CUDA-graph replay, L2 flushed: minikv.bench.attention.cuda_time_ms) at five batch x context shapes, with
   bf16, the block placement and the row window (the previous row path) measured in the same run.
Writes probe.csv; prints the best candidate per format and its ratio over bf16 per shape.
"""
import csv
import dataclasses
import math
import multiprocessing as mp
import os
import sys
import time

import torch

FORMATS = ("int8_per_token_head", "fp8_per_token_head")
SHAPES = ((64, 4096), (16, 4096), (16, 16384), (64, 16384), (256, 4096))
# (warps, block_n, stages, max_registers)
CANDIDATES = [(4, 16, 4, None), (4, 16, 5, None), (4, 16, 6, None), (4, 32, 4, None), (4, 32, 5, None),
              (8, 16, 5, None), (8, 16, 6, None), (8, 32, 4, None), (8, 32, 5, None), (8, 32, 6, None),
              (8, 16, 6, 128), (8, 32, 4, 128), (8, 32, 5, 128), (4, 16, 6, 168), (4, 32, 4, 168)]


def cfg_for(cand, splits, row_quads=True):
    from minikv.kernels.launch import DecodeConfig
    warps, block_n, stages, regs = cand
    return DecodeConfig(16, block_n, splits, warps, stages, f16_dot=True, convert_asm=True, max_registers=regs,
                        row_quads=row_quads)


def default_splits(batch, ctx, block_n):
    from minikv.kernels.launch import decode_splits
    return decode_splits(batch, 2, ctx, block_n, 132)


def _compile(args):
    import minikv.kernels  # noqa: F401
    from minikv.bench.attention import decode_problem
    from minikv.kernels.decode_attention import paged_decode_attention
    failed = []
    for fmt, cand in args:
        try:
            layout, pool, tables, lens, q, out = decode_problem(fmt, 2, 1024)
            for splits in (1, 2):
                paged_decode_attention(q, pool, tables, lens, layout, 128 ** -0.5, out=out, validate=False,
                                       config=cfg_for(cand, splits))
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{fmt} {cand}: {type(exc).__name__}: {str(exc)[:200]}")
    return failed


def check(fmt, cand):
    from minikv.cache.layout import KVLayout
    from minikv.bench.attention import fill_pool
    from minikv.kernels.decode_attention import paged_decode_attention, paged_decode_attention_reference
    torch.manual_seed(0)
    layout = KVLayout(fmt, torch.bfloat16, 8, 128, 16, "row")
    lens = torch.tensor([1, 700, 2049], dtype=torch.int32, device="cuda")
    tables = torch.randperm(3 * 129, device="cuda").to(torch.int32).view(3, 129)
    pool = torch.full((3 * 129, layout.block_bytes), 0x7F, dtype=torch.uint8, device="cuda")
    fill_pool(pool, layout)
    q = torch.randn(3, 32, 128, dtype=torch.bfloat16, device="cuda")
    ref = paged_decode_attention_reference(q, pool, tables, lens, layout, 128 ** -0.5).float()
    worst = 0.0
    for splits in (1, 3, 8):
        got = paged_decode_attention(q, pool, tables, lens, layout, 128 ** -0.5, config=cfg_for(cand, splits))
        worst = max(worst, (got.float() - ref).abs().max().item())
    return worst


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    from minikv.bench.attention import cuda_time_ms, decode_case, decode_problem
    from minikv.kernels.decode_attention import paged_decode_attention
    jobs = [(fmt, c) for fmt in FORMATS for c in CANDIDATES]
    start = time.time()
    with mp.get_context("spawn").Pool(15) as pool:
        failed = sum(pool.map(_compile, [jobs[i::15] for i in range(15)]), [])
    print(f"compiled {len(jobs)} candidates in {time.time() - start:.0f} s; failed: {failed}", flush=True)
    for fmt in FORMATS:
        for cand in CANDIDATES:
            try:
                print(f"check {fmt} {cand}: max |diff| {check(fmt, cand):.4f}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"check {fmt} {cand}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    f = open(os.path.join(out_dir, "probe.csv"), "w", newline="")
    w = csv.DictWriter(f, ["format", "batch", "context", "path", "warps", "block_n", "stages", "max_registers",
                           "splits", "us", "error"])
    w.writeheader()
    for batch, ctx in SHAPES:
        base = {}
        for fmt in ("auto", "int8_per_token_head/block", "fp8_per_token_head/block"):
            r = decode_case(fmt, batch, ctx)
            base[fmt] = r["ms"] * 1e3
            w.writerow(dict(format=fmt, batch=batch, context=ctx, path=r["kernel"], splits=r["splits"],
                            block_n=r["block_n"], stages=r["stages"], us=base[fmt]))
        line = [f"{batch}x{ctx}: bf16 {base['auto']:.1f} us"]
        for fmt in FORMATS:
            layout, pool_, tables, lens, q, out = decode_problem(fmt, batch, ctx)
            call = lambda cfg: cuda_time_ms(lambda: paged_decode_attention(q, pool_, tables, lens, layout, 128 ** -0.5,
                                                                       out=out, validate=False, config=cfg)).ms * 1e3
            from minikv.kernels import launch
            wcfg = launch.decode_config(batch, 8, 4, 128, 1, ctx, torch.device("cuda"), fmt=layout.fmt,
                                        placement=layout.placement)
            wcfg = dataclasses.replace(wcfg, row_quads=False, block_n=128, num_warps=4, num_stages=5,
                                       num_splits=max(1, min(64, round(132 * 4 / (batch * 8)), ctx // 256)))
            window_us = call(wcfg)
            w.writerow(dict(format=fmt, batch=batch, context=ctx, path="row-window", warps=4, block_n=128, stages=5,
                            splits=wcfg.num_splits, us=window_us))
            best = (math.inf, None)
            for cand in CANDIDATES:
                d = default_splits(batch, ctx, cand[1])
                for splits in sorted({max(1, d // 2), d, min(64, 2 * d)}):
                    r = dict(format=fmt, batch=batch, context=ctx, path="row-quads", warps=cand[0], block_n=cand[1],
                             stages=cand[2], max_registers=cand[3], splits=splits)
                    try:
                        r["us"] = call(cfg_for(cand, splits))
                        best = min(best, (r["us"], (cand, splits)))
                    except Exception as exc:  # noqa: BLE001
                        r["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
                    w.writerow(r)
                    f.flush()
            blk = base[fmt + "/block"]
            line.append(f"{fmt}: window {base['auto'] / window_us:.3f}x, block {base['auto'] / blk:.3f}x, "
                        f"quads best {base['auto'] / best[0]:.3f}x {best[1]}")
            del pool_
            torch.cuda.empty_cache()
        print(" | ".join(line), flush=True)
    f.close()


if __name__ == "__main__":
    main(sys.argv[1])

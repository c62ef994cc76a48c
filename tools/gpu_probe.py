"""Issue 20's probe on a GPU: every candidate decode configuration checked against the torch reference and timed,
beside today's kernels (a copy of main's kernels/ package, `--old`), in one process.

    python3 tools/gpu_probe.py --out DIR [--old PATH_TO_OLD_KERNELS_PARENT] [--quick]

Writes DIR/probe.csv (one row per format x shape x variant: time, GB/s, error against the reference) and
DIR/best.json (the fastest correct variant per format and shape), and prints a summary table last.
Variants are DecodeConfig fields over launch.decode_config's choice (restored afterwards).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

HQ, HKV, D, BS = 32, 8, 128, 16
ONE_BYTE = ("fp8", "int8_per_token_head", "fp8_per_token_head", "int8_per_token_head/block",
            "fp8_per_token_head/block")
FORMATS = ("auto",) + ONE_BYTE

# DecodeConfig overrides tried at every shape (launch.decode_config's choice with these fields replaced)
VARIANTS_ONE_BYTE = {
    "default": {},
    "stages3": dict(num_stages=3),
    "stages4": dict(num_stages=4),
    "stages8": dict(num_stages=8),
    "bn128": dict(block_n=128),
    "bn32-st8": dict(block_n=32, num_stages=8),
    "reg128": dict(max_registers=128),
    "cast": dict(convert_asm=False),
    "kimpure": dict(k_pure=False),
    "warps8-bn128": dict(block_n=128, num_warps=8),
    "bf16dot": dict(f16_dot=False),
}
VARIANTS_AUTO = {
    "default": {},
    "stages3": dict(num_stages=3),
    "stages4": dict(num_stages=4),
    "bn32": dict(block_n=32),
    "bn128-st3": dict(block_n=128, num_stages=3),
    "warps8": dict(num_warps=8),
}
# split-K choices (the same compiled kernels; num_splits is a launch argument) at the shapes where they matter
SPLIT_VARIANTS = {
    "splits-sep": dict(merge_in_kernel=False),
    "waves2": "waves=2",
    "waves0.5": "waves=0.5",
    "waves4": "waves=4",
    "mintiles1": "min_tiles=1",
    "mintiles4": "min_tiles=4",
}
SHAPES = [(64, 4096), (16, 4096), (16, 16384), (256, 4096), (64, 512), (16, 512), (1, 512), (1, 4096)]
# --second: the second call's check of the chosen defaults (and the vectorized merge) against a few alternatives
SECOND_ONE_BYTE = {"default": {}, "stages4": dict(num_stages=4), "vpure": dict(v_pure=True),
                   "vpure-st4": dict(v_pure=True, num_stages=4), "bn64-vpure": dict(block_n=64, v_pure=True),
                   "splits-sep": dict(merge_in_kernel=False)}
SECOND_AUTO = {"default": {}, "splits-sep": dict(merge_in_kernel=False)}
SECOND_SHAPES = [(64, 4096), (16, 4096), (1, 4096), (16, 512)]
SPLIT_SHAPES = [(1, 512), (1, 4096), (16, 512), (16, 4096), (64, 512), (64, 4096)]


def layout_for(name, dtype=torch.bfloat16, kv_heads=HKV, head_size=D):
    from minikv.cache.layout import KVLayout
    kv_cache_dtype, _, placement = name.partition("/")
    return KVLayout(kv_cache_dtype, dtype, kv_heads, head_size, BS, placement or "row")


def fill(pool, layout, seed=0):
    """Random codes in range and random per-token-head scales (not zeros, not constants)."""
    gen = torch.Generator(device=pool.device).manual_seed(seed)
    for codes in layout.code_views(pool):
        for start in range(0, codes.shape[0], 4096):
            part = codes[start:start + 4096]
            values = torch.randn(part.shape, device=pool.device, generator=gen)
            if layout.code_dtype == torch.int8:
                part.copy_(values.mul(40).round().clamp(-127, 127).to(torch.int8))
            else:
                part.copy_(values.mul(30).clamp(-448, 448).to(layout.code_dtype))
    if layout.has_inline_scales:
        for s in layout.scale_views(pool):
            s.copy_(torch.rand(s.shape, device=pool.device, generator=gen) * 0.015 + 0.005)


class Problem:
    def __init__(self, fmt, batch, ctx, heads=(HQ, HKV), head_size=D, dtype=torch.bfloat16):
        self.fmt, self.batch, self.ctx = fmt, batch, ctx
        self.layout = layout_for(fmt, dtype, heads[1], head_size)
        blocks = batch * ctx // BS
        self.pool = torch.empty(blocks, self.layout.block_bytes, dtype=torch.uint8, device="cuda")
        fill(self.pool, self.layout)
        self.tables = torch.randperm(blocks, device="cuda").to(torch.int32).view(batch, ctx // BS)
        self.lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        # every sequence one token shorter than its table, some shorter still: ragged last tiles
        self.lens -= torch.arange(batch, device="cuda", dtype=torch.int32) % 37
        self.q = torch.randn(batch, heads[0], head_size, device="cuda", dtype=dtype)
        self.out = torch.empty_like(self.q)
        self.sm = head_size ** -0.5
        self.nbytes = (int(self.lens.sum()) * self.layout.bytes_per_token() + 2 * self.q.numel() * 2
                       + self.tables.numel() * 4)
        self._ref = None

    def call(self, kernels):
        return lambda: kernels.paged_decode_attention(self.q, self.pool, self.tables, self.lens, self.layout,
                                                      self.sm, 0.8, 1.3, out=self.out, validate=False)

    def reference(self, kernels):
        if self._ref is None:
            self._ref = kernels.paged_decode_attention_reference(self.q, self.pool, self.tables, self.lens,
                                                                 self.layout, self.sm, 0.8, 1.3).float()
        return self._ref

    def error(self, kernels):
        self.out.fill_(float("nan"))
        self.call(kernels)()
        ref = self.reference(kernels)
        return float((self.out.float() - ref).norm() / ref.norm())


def patched(launch, overrides, waves=None, min_tiles=None):
    """launch.decode_config with `overrides` applied (and the split sizing's constants), restorable."""
    original = launch.decode_config
    saved = (launch.DECODE_WAVES, launch.DECODE_MIN_TILES)
    if waves is not None:
        launch.DECODE_WAVES = waves
    if min_tiles is not None:
        launch.DECODE_MIN_TILES = min_tiles

    def config(*a, **k):
        return dataclasses.replace(original(*a, **k), **overrides)
    launch.decode_config = config

    def restore():
        launch.decode_config = original
        launch.DECODE_WAVES, launch.DECODE_MIN_TILES = saved
    return restore


def time_us(fn):
    from minikv.bench.timing import time_ms
    t = time_ms(fn, "cuda", reps=20, graph=True)
    return 1e3 * t.ms, t.how


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--old", type=Path, default=None, help="folder holding a package `oldkernels` (main's kernels/)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--second", action="store_true", help="the second call's variants and shapes")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import triton
    import minikv.kernels as kernels
    from minikv.kernels import launch
    old = None
    if args.old:
        sys.path.insert(0, str(args.old))
        old = importlib.import_module("oldkernels")
    props = torch.cuda.get_device_properties(0)
    print(f"{torch.cuda.get_device_name()}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    shapes = SECOND_SHAPES if args.second else SHAPES[:3] if args.quick else SHAPES
    rows = []
    fields = ["kind", "format", "batch", "ctx", "variant", "us", "GBps", "err", "splits", "block_n", "stages",
              "warps", "timing", "error"]
    sink = open(args.out / "probe.csv", "w", newline="")
    writer = csv.DictWriter(sink, fieldnames=fields)
    writer.writeheader()

    def record(**r):
        rows.append(r)
        writer.writerow(r)
        sink.flush()
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)

    start_all = time.time()
    for batch, ctx in shapes:
        import torch.nn.functional as F
        qs = torch.randn(batch, HQ, 1, D, dtype=torch.bfloat16, device="cuda")
        ks = torch.randn(batch, HKV, ctx, D, dtype=torch.bfloat16, device="cuda")
        vs = torch.randn_like(ks)           # not ks again: V would come from L2 after K
        sdpa, _ = time_us(lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True))
        del qs, ks, vs
        record(kind="sdpa", format="auto", batch=batch, ctx=ctx, variant="sdpa", us=sdpa)
        for fmt in FORMATS:
            prob = Problem(fmt, batch, ctx)
            if args.second:
                variants = dict(SECOND_AUTO if fmt == "auto" else {} if fmt in ("int8_per_token_head",
                                "fp8_per_token_head") else SECOND_ONE_BYTE)
                variants.setdefault("default", {})
            else:
                variants = dict(VARIANTS_AUTO if fmt == "auto" else VARIANTS_ONE_BYTE)
            if (batch, ctx) in SPLIT_SHAPES and not args.second:
                variants.update({k: v for k, v in SPLIT_VARIANTS.items()})
            for name, v in variants.items():
                kw = {}
                overrides = v
                if isinstance(v, str):
                    key, value = v.split("=")
                    kw[key] = float(value) if key == "waves" else int(value)
                    overrides = {}
                restore = patched(launch, overrides, **kw)
                try:
                    cfg = launch.decode_config(batch, HKV, HQ // HKV, D, prob.layout.elem_bytes,
                                               prob.tables.shape[1] * BS, torch.device("cuda"),
                                               fmt=prob.layout.fmt, placement=prob.layout.placement)
                    err = prob.error(kernels)
                    us, how = time_us(prob.call(kernels))
                    record(kind="decode", format=fmt, batch=batch, ctx=ctx, variant=name, us=us,
                           GBps=prob.nbytes / us / 1e3, err=err, splits=cfg.num_splits, block_n=cfg.block_n,
                           stages=cfg.num_stages, warps=cfg.num_warps, timing=how)
                except Exception as e:          # noqa: BLE001 - a failing variant is a finding, not the end
                    record(kind="decode", format=fmt, batch=batch, ctx=ctx, variant=name, us=float("nan"),
                           error=f"{type(e).__name__}: {str(e)[:200]}")
                    traceback.print_exc()
                finally:
                    restore()
            if old is not None:
                try:
                    us, how = time_us(prob.call(old))
                    record(kind="decode", format=fmt, batch=batch, ctx=ctx, variant="today", us=us,
                           GBps=prob.nbytes / us / 1e3, err=prob.error(old), timing=how)
                except Exception as e:          # noqa: BLE001
                    record(kind="decode", format=fmt, batch=batch, ctx=ctx, variant="today", us=float("nan"),
                           error=f"{type(e).__name__}: {str(e)[:200]}")
            del prob
            torch.cuda.empty_cache()
        print(f"-- shape done at {time.time() - start_all:.0f} s", flush=True)

    sink.close()
    best, lines = {}, []
    dec_rows = [r for r in rows if r["kind"] == "decode" and not math.isnan(r["us"])
                and r.get("err", 1) < 2e-2]
    for batch, ctx in shapes:
        auto = min((r["us"] for r in dec_rows if r["format"] == "auto" and r["batch"] == batch and r["ctx"] == ctx
                    and r["variant"] != "today"), default=float("nan"))
        auto_today = next((r["us"] for r in dec_rows if r["format"] == "auto" and r["batch"] == batch
                           and r["ctx"] == ctx and r["variant"] == "today"), float("nan"))
        sdpa = next(r["us"] for r in rows if r["kind"] == "sdpa" and r["batch"] == batch and r["ctx"] == ctx)
        for fmt in FORMATS:
            mine = [r for r in dec_rows if r["format"] == fmt and r["batch"] == batch and r["ctx"] == ctx]
            new = [r for r in mine if r["variant"] != "today"]
            if not new:
                continue
            b = min(new, key=lambda r: r["us"])
            d = next((r for r in new if r["variant"] == "default"), b)
            today = next((r["us"] for r in mine if r["variant"] == "today"), float("nan"))
            best[f"{fmt}|{batch}|{ctx}"] = b["variant"]
            lines.append(f"{fmt:26s} {batch:4d} {ctx:6d}  default {d['us']:7.1f} us  best {b['variant']:12s} "
                         f"{b['us']:7.1f} us ({b['GBps']:5.0f} GB/s)  today {today:7.1f}  x bf16(best) "
                         f"{auto / b['us']:4.2f}  x bf16(today) {auto_today / b['us']:4.2f}  sdpa/min "
                         f"{sdpa / b['us']:4.2f}")
    (args.out / "best.json").write_text(json.dumps(best, indent=1))
    failed = [r for r in rows if r["kind"] == "decode" and (math.isnan(r["us"]) or r.get("err", 0) >= 2e-2)]
    print(f"\n{len(failed)} failing variants:")
    for r in failed:
        print("  FAIL", r["format"], r["batch"], r["ctx"], r["variant"], r.get("err"), r.get("error", ""))
    print(f"\nprobe took {time.time() - start_all:.0f} s\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can a register cap buy the 1-byte decode kernel more programs per SM? On a CUDA machine:

    python tools/gpu_probes/decode_occupancy.py OUT_DIR [128|512 ...]

Shape 128 is the attention bench's target shape (32 query heads over 8 KV heads of 128, batch 64, context 4096),
128b16 the same at batch 16; 256 and 512 are gemma-4-E2B's sliding and full layers (8 over 1 KV head, window 512 and none, batch 64, context
8192). GRID (environment) replaces a shape's grid. At each, bf16 and the "block"
placement at launch.decode_config's choice, and the formats in GRID_FORMATS (environment; default: both
per-token-head formats in the "row" placement) over a grid of tiles, stages, split counts and register caps (max_registers; None: the compiler's choice). Every candidate is checked against the
torch reference on a small problem before it is timed (CUDA-graph replay, L2 flushed: bench.attention.cuda_time_ms).
Prints each row with bf16's time over it, and writes decode_occupancy.csv.
"""
import csv
import dataclasses
import itertools
import os
import sys

import torch

SHAPES = {"128": dict(heads=(32, 8), head_size=128, batch=64, ctx=4096, window=0),
          "128b16": dict(heads=(32, 8), head_size=128, batch=16, ctx=4096, window=0),
          "256": dict(heads=(8, 1), head_size=256, batch=64, ctx=8192, window=512),
          "512": dict(heads=(8, 1), head_size=512, batch=64, ctx=8192, window=0)}
ROW_FORMATS = ("int8_per_token_head", "fp8_per_token_head")
GRID_FORMATS = tuple(os.environ.get("GRID_FORMATS", " ".join(ROW_FORMATS)).split())
# (block_n, stages, max_registers, warps, programs as a multiple of the default's[, splits: this many instead])
GRID = {"128": list(itertools.product((64, 128), (3, 4, 5), (None, 168, 128), (4,), (1,))),
        "128b16": [(n, s, None, 4, 1, p) for n in (32, 64, 128) for s in (3, 4) for p in (2, 3, 4, 6, 8, 12)],
        "256": list(itertools.product((32, 64), (3, 4), (None, 168, 128), (4,), (1,))),
        "512": list(itertools.product((16, 32), (3, 4, 5), (None, 168, 128), (4,), (1,)))}
if os.environ.get("GRID"):  # "SHAPE:NxSTAGESxREGSxWARPSxPROGRAMS[xSPLITS],..." (REGS 0: the compiler's choice)
    for item in os.environ["GRID"].split(","):
        key, _, spec = item.partition(":")
        n, st, r, w, *p = (int(v) for v in spec.split("x"))
        GRID.setdefault("env:" + key, []).append((n, st, r or None, w, *p))
    GRID.update({k[4:]: v for k, v in GRID.items() if k.startswith("env:")})


def layout_of(name, shape):
    from minikv.cache.layout import KVLayout
    fmt, _, placement = name.partition("/")
    return KVLayout(fmt, torch.bfloat16, shape["heads"][1], shape["head_size"], 16, placement or "row")


def problem(name, shape, batch, ctx):
    from minikv.bench.attention import fill_pool
    torch.manual_seed(0)
    layout = layout_of(name, shape)
    blocks = batch * ((ctx + 15) // 16)
    pool = torch.empty(blocks, layout.block_bytes, dtype=torch.uint8, device="cuda")
    fill_pool(pool, layout)
    tables = torch.randperm(blocks, device="cuda").to(torch.int32).view(batch, -1)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, shape["heads"][0], shape["head_size"], dtype=torch.bfloat16, device="cuda")
    return layout, pool, tables, lens, q


def candidates(name, shape_key):
    from minikv.kernels import launch
    shape = SHAPES[shape_key]
    layout = layout_of(name, shape)
    num_heads, kv_heads = shape["heads"]
    base = launch.decode_config(shape["batch"], kv_heads, num_heads // kv_heads, shape["head_size"],
                                layout.elem_bytes, shape["ctx"], torch.device("cuda"), fmt=layout.fmt,
                                placement=layout.placement)
    cands = [("default", base)]
    if name in GRID_FORMATS:
        cands += [("grid", dataclasses.replace(base, block_n=n, num_stages=s, max_registers=r, num_warps=w,
                                               num_splits=splits[0] if splits else base.num_splits * p))
                  for n, s, r, w, p, *splits in GRID[shape_key]]
    return cands


def check(layout_args, cfg, window):
    from minikv.kernels import paged_decode_attention
    from minikv.kernels.decode_attention import paged_decode_attention_reference
    layout, pool, tables, lens, q = layout_args
    lens = torch.tensor([1, 700, 1024], dtype=torch.int32, device="cuda")
    try:
        got = paged_decode_attention(q, pool, tables, lens, layout, q.shape[-1] ** -0.5, config=cfg,
                                     sliding_window=window)
        ref = paged_decode_attention_reference(q, pool, tables, lens, layout, q.shape[-1] ** -0.5,
                                               sliding_window=window)
        return (got.float() - ref.float()).abs().max().item()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def main(out_dir, shape_keys):
    import minikv.kernels  # noqa: F401
    from minikv.bench.attention import cuda_time_ms
    from minikv.kernels import paged_decode_attention
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for key in shape_keys:
        shape = SHAPES[key]
        bf16_us = None
        for name in ("auto", *ROW_FORMATS, "fp8_per_token_head/block"):
            small = problem(name, shape, 3, 1024)
            layout, pool, tables, lens, q = problem(name, shape, shape["batch"], shape["ctx"])
            out = torch.empty_like(q)
            for label, cfg in candidates(name, key):
                diff = check(small, cfg, shape["window"])
                row = dict(shape=key, format=name, config=label, block_n=cfg.block_n, stages=cfg.num_stages,
                           max_registers=cfg.max_registers, warps=cfg.num_warps, splits=cfg.num_splits,
                           max_abs_diff=diff, us="")
                if isinstance(diff, float) and diff < 0.05:
                    ms, _ = cuda_time_ms(lambda: paged_decode_attention(
                        q, pool, tables, lens, layout, q.shape[-1] ** -0.5, out=out, validate=False, config=cfg,
                        sliding_window=shape["window"]))
                    row["us"] = ms * 1e3
                    bf16_us = row["us"] if name == "auto" else bf16_us
                rows.append(row)
                ratio = f"bf16/this {bf16_us / row['us']:.3f}x" if row["us"] and bf16_us else ""
                print(f"head {shape['head_size']} {name:26s} {label:8s} block_n {cfg.block_n:3d} stages "
                      f"{cfg.num_stages} maxreg {str(cfg.max_registers):4s} warps {cfg.num_warps} "
                      f"splits {cfg.num_splits:2d}: "
                      + (f"{row['us']:7.1f} us {ratio}" if row["us"] else f"skipped ({diff})"), flush=True)
            del pool
            torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "decode_occupancy.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["128", "256", "512"])

"""Would a 1-byte cache's prefill be faster dequantized first? At gemma-4-E2B's shapes, on a CUDA machine:

    python tools/gpu_probes/context_dequant_probe.py OUT_DIR

The fused paged context kernel reads 1-byte codes and converts them in registers before each dot product; at head
sizes 256 and 512 that takes 1.5-2.8 times bf16's time (results/gpu/context-e2b-2026-12-06-h100/formats). The
alternative timed here: gather and dequantize each sequence's K/V from the pool into a bf16 workspace with torch
ops, then run the unfused context kernel over it, the bf16 speed. For each format: the fused kernel, the gather
alone, the gather plus the unfused kernel, bf16's fused kernel on the same K/V; and each path's largest difference
from the fp32 torch reference. One engine prefill step: 8 prompts of 2,048 tokens, 8 query heads over 1 KV head.
Writes context_dequant_probe.csv. `--check` runs a small problem through both paths on this machine (a CPU too).

The two paths round differently: the fused kernel keeps each code exact and applies the per-token-head scales to
the scores and probabilities in fp32, while the workspace holds code x scale rounded to the model's dtype. On CPU
(float16) that makes the dequantized path's largest error about 4-8x the fused one's for the per-token-head formats
and equal for fp8 per tensor; the GPU run prints the same comparison in bf16, which rounds 8x coarser.
"""
import csv
import os
import sys

import torch

HQ, HKV, BS = 8, 1, 16
SHAPES = ((256, 512), (512, 0))          # (head size, sliding window)
FORMATS = ("auto", "fp8", "fp8_per_token_head", "int8_per_token_head", "fp8_per_token_head/block",
           "int8_per_token_head/block")


def dequantized(pool, layout, tables, lens, kv: int, dtype) -> torch.Tensor:
    """[sum(lens), Hkv, D] in `dtype`: half `kv` (0 = K) of each sequence's first lens[b] tokens, dequantized."""
    lens = lens.to(torch.int64)
    starts = torch.cumsum(lens, 0) - lens
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    pos = torch.arange(int(lens.sum()), device=lens.device) - starts[seq]
    slots = tables.to(torch.int64)[seq, pos // layout.block_size] * layout.block_size + pos % layout.block_size
    codes = layout.code_views(pool)[kv].reshape(-1, layout.num_kv_heads, layout.head_size)[slots]
    x = codes.to(torch.float32)
    if layout.has_inline_scales:
        x = x * layout.scale_views(pool)[kv].reshape(-1, layout.num_kv_heads)[slots][..., None]
    return x.to(dtype)


def problem(fmt, head_size, batch, length, device, dtype, seed=0):
    from minikv.cache.layout import KVLayout
    from minikv.kernels.cache_write import write_kv
    torch.manual_seed(seed)
    kv_cache_dtype, _, placement = fmt.partition("/")
    layout = KVLayout(kv_cache_dtype, dtype, HKV, head_size, BS, placement or "row")
    q = torch.randn(batch * length, HQ, head_size, dtype=dtype, device=device)
    k = torch.randn(batch * length, HKV, head_size, dtype=dtype, device=device)
    v = torch.randn_like(k)
    blocks = batch * length // BS
    pool = torch.zeros(blocks, layout.block_bytes, dtype=torch.uint8, device=device)
    tables = torch.randperm(blocks, device=device).to(torch.int32).view(batch, length // BS)
    slots = (tables.long()[:, :, None] * BS + torch.arange(BS, device=device)).reshape(-1)
    write_kv(k, v, pool, slots, layout, validate=False)
    cu = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * length
    lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    return layout, q, pool, tables, cu, lens


def paths(layout, q, pool, tables, cu, lens, window):
    """name -> callable: the fused kernel, the gather alone, the gather and the unfused kernel."""
    from minikv.kernels.context_attention import context_attention, paged_context_attention

    def dequant_then_unfused():
        k = dequantized(pool, layout, tables, lens, 0, q.dtype)
        v = dequantized(pool, layout, tables, lens, 1, q.dtype)
        return context_attention(q, k, v, cu, cu, True, 1.0, validate=False, sliding_window=window)
    return {"fused": lambda: paged_context_attention(q, pool, tables, cu, lens, layout, True, 1.0, validate=False,
                                                     sliding_window=window),
            "gather only": lambda: (dequantized(pool, layout, tables, lens, 0, q.dtype),
                                    dequantized(pool, layout, tables, lens, 1, q.dtype)),
            "gather + unfused": dequant_then_unfused}


def check(device="cpu", dtype=torch.float16):
    """Both paths on a small problem against the fp32 reference: {(format, head size): (fused, dequantized)}."""
    from minikv.kernels.context_attention import paged_context_attention_reference
    out = {}
    for head_size, window in ((64, 8), (128, 0)):
        for fmt in FORMATS:
            layout, q, pool, tables, cu, lens = problem(fmt, head_size, 2, 32, device, dtype)
            ref = paged_context_attention_reference(q, pool, tables, cu, lens, layout, True, 1.0,
                                                    sliding_window=window).float()
            ways = paths(layout, q, pool, tables, cu, lens, window)
            out[(fmt, head_size)] = tuple((ways[name]().float() - ref).abs().max().item()
                                          for name in ("fused", "gather + unfused"))
    return out


def main(out_dir):
    from minikv.bench.attention import cuda_time_ms
    os.makedirs(out_dir, exist_ok=True)
    diffs = check("cuda", torch.bfloat16)
    for (fmt, head_size), (fused, deq) in diffs.items():
        print(f"check head {head_size} {fmt:26s}: max |diff| fused {fused:.4f}, dequantized {deq:.4f}", flush=True)
    with open(os.path.join(out_dir, "context_dequant_probe.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["head_size", "window", "format", "path", "us", "over_bf16_fused"])
        w.writeheader()
        for head_size, window in SHAPES:
            bf16_us = None
            for fmt in FORMATS:
                layout, q, pool, tables, cu, lens = problem(fmt, head_size, 8, 2048, "cuda", torch.bfloat16)
                for name, fn in paths(layout, q, pool, tables, cu, lens, window).items():
                    if fmt == "auto" and name != "fused":
                        continue
                    us = 1e3 * cuda_time_ms(fn, reps=10).ms
                    bf16_us = bf16_us or us
                    w.writerow(dict(head_size=head_size, window=window, format=fmt, path=name, us=us,
                                    over_bf16_fused=us / bf16_us))
                    print(f"head {head_size} {fmt:26s} {name:17s}: {us:8.1f} us ({us / bf16_us:.2f}x bf16 fused's "
                          f"time)", flush=True)
                del layout, q, pool
                torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        for (fmt, head_size), (fused, deq) in check().items():
            print(f"head {head_size} {fmt:26s}: max |diff| fused {fused:.4f}, dequantized {deq:.4f}")
    else:
        main(sys.argv[1])

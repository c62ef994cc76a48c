"""`python -m minikv.bench.decode_step`: tokens/s of a model-sized decode step per KV-cache format (GPU).
See docs/internals.md#bench-decode-step."""
from __future__ import annotations

import argparse
import sys

import torch

from minikv.kernels.formats import KV_CACHE_DTYPES

LAYERS, HIDDEN, HQ, HKV, D, INTER, VOCAB, BS = 16, 2048, 32, 8, 128, 8192, 128256, 16


def _rms(x, w):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)


def decode_step_ms(kv_cache_dtype: str, batch: int, context: int, reps: int = 20) -> float:
    from minikv.bench.attention import fill_pool
    from minikv.cache.layout import KVLayout
    from minikv.kernels.cache_write import write_kv
    from minikv.kernels.decode_attention import paged_decode_attention
    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"

    def weight(*shape):
        return (torch.randn(*shape, device=dev) * 0.02).to(dt)

    layers = [dict(norm1=torch.ones(HIDDEN, device=dev, dtype=dt), qkv=weight(HIDDEN, (HQ + 2 * HKV) * D),
                   o=weight(HQ * D, HIDDEN), norm2=torch.ones(HIDDEN, device=dev, dtype=dt),
                   gate_up=weight(HIDDEN, 2 * INTER), down=weight(INTER, HIDDEN)) for _ in range(LAYERS)]
    head, final_norm = weight(HIDDEN, VOCAB), torch.ones(HIDDEN, device=dev, dtype=dt)
    layout = KVLayout(kv_cache_dtype, dt, HKV, D, BS)
    blocks = batch * context // BS
    pools = []
    for _ in range(LAYERS):
        pool = torch.empty(blocks, layout.block_bytes, dtype=torch.uint8, device=dev)
        fill_pool(pool, layout)
        pools.append(pool)
    tables = torch.randperm(blocks, device=dev).to(torch.int32).view(batch, context // BS)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    last = context - 1
    slots = tables[:, last // BS].long() * BS + last % BS          # the new token's slot in every sequence
    x0 = torch.randn(batch, HIDDEN, device=dev, dtype=dt)
    attn_out = torch.empty(batch, HQ, D, device=dev, dtype=dt)
    scale = D ** -0.5

    def step():
        x = x0
        for lw, pool in zip(layers, pools):
            qkv = _rms(x, lw["norm1"]) @ lw["qkv"]
            q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
            write_kv(k.reshape(batch, HKV, D), v.reshape(batch, HKV, D), pool, slots, layout, validate=False)
            paged_decode_attention(q.reshape(batch, HQ, D), pool, tables, lens, layout, scale, out=attn_out,
                                   validate=False)
            x = x + attn_out.view(batch, HQ * D) @ lw["o"]
            gate, up = (_rms(x, lw["norm2"]) @ lw["gate_up"]).chunk(2, dim=1)
            x = x + (torch.nn.functional.silu(gate) * up) @ lw["down"]
        return (_rms(x, final_norm) @ head).argmax(dim=-1)

    from minikv.bench.attention import cuda_time_ms
    return cuda_time_ms(step, reps=reps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minikv.bench.decode_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--formats", nargs="+", default=list(KV_CACHE_DTYPES), choices=KV_CACHE_DTYPES)
    p.add_argument("--csv", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 0
    rows = []
    for fmt in args.formats:
        ms = decode_step_ms(fmt, args.batch, args.context)
        rows.append((fmt, ms, args.batch / ms * 1e3))
    base = rows[0][2]
    print(f"decode step, 1.4B-parameter Llama-like model (random weights), batch {args.batch}, context "
          f"{args.context}, CUDA graph:")
    for fmt, ms, tps in rows:
        print(f"  {fmt:22s} {ms:8.3f} ms/step  {tps:9.1f} tokens/s  {tps / base:5.3f}x {rows[0][0]}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("format,batch,context,ms_per_step,tokens_per_s\n")
            for fmt, ms, tps in rows:
                f.write(f"{fmt},{args.batch},{args.context},{ms},{tps}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

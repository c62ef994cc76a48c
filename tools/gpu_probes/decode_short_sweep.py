"""bf16 paged decode at short contexts, where it trails torch's SDPA (batch 16 / context 512: 0.81x on the H200):

    python tools/gpu_probes/decode_short_sweep.py OUT_DIR

The kernel bench's geometry (32 query heads over 8 KV heads, head size 128, blocks of 16). For each shape: SDPA on a
contiguous cache, launch.decode_config's own choice ("default"), and a grid of split counts x tokens per tile x
pipeline stages. Each candidate is checked against the torch reference first. Timings: CUDA-graph replay, L2 flushed. Writes decode_short_sweep.csv.
"""
import csv
import dataclasses
import itertools
import os
import sys

import torch

SHAPES = ((1, 512), (16, 512), (64, 512), (256, 512), (1, 4096), (16, 4096))
GRID = list(itertools.product((1, 2, 4, 8, 16), (32, 64), (2, 3, 4)))


def main(out_dir):
    from minikv.bench.attention import D, HKV, HQ, cuda_time_ms, decode_problem, sdpa_decode_ms
    from minikv.kernels import launch
    from minikv.kernels.decode_attention import paged_decode_attention, paged_decode_attention_reference
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, "decode_short_sweep.csv"), "w", newline="")
    w = csv.DictWriter(f, ["batch", "context", "config", "splits", "block_n", "stages", "us",
                           "sdpa_over_minikv", "max_abs_diff", "error"])
    w.writeheader()
    for batch, ctx in SHAPES:
        layout, pool, tables, lens, q, out = decode_problem("auto", batch, ctx)
        ref = paged_decode_attention_reference(q, pool, tables, lens, layout, D ** -0.5)
        sdpa_us = 1e3 * sdpa_decode_ms(batch, ctx).ms
        w.writerow(dict(batch=batch, context=ctx, config="sdpa", us=sdpa_us))
        base = launch.decode_config(batch, HKV, HQ // HKV, D, 2, ctx, torch.device("cuda"), fmt=layout.fmt)
        cands = [("default", base)] + [("grid", dataclasses.replace(base, num_splits=s, block_n=n, num_stages=st))
                                       for s, n, st in GRID if s * n <= ctx]
        results = []
        for name, cfg in cands:
            r = dict(batch=batch, context=ctx, config=name, splits=cfg.num_splits, block_n=cfg.block_n,
                     stages=cfg.num_stages)
            try:
                got = paged_decode_attention(q, pool, tables, lens, layout, D ** -0.5, out=out, validate=False,
                                             config=cfg)
                r["max_abs_diff"] = diff = (got.float() - ref.float()).abs().max().item()
                if diff > 0.02:
                    raise RuntimeError(f"differs from the reference by {diff}")
                r["us"] = 1e3 * cuda_time_ms(lambda: paged_decode_attention(
                    q, pool, tables, lens, layout, D ** -0.5, out=out, validate=False, config=cfg)).ms
                r["sdpa_over_minikv"] = sdpa_us / r["us"]
                results.append((r["us"], name, cfg))
            except Exception as exc:  # noqa: BLE001
                r["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            w.writerow(r)
            f.flush()
        results.sort(key=lambda t: t[0])
        default_us = next(us for us, name, _ in results if name == "default")
        us, _, cfg = results[0]
        print(f"batch {batch:3d} context {ctx:5d}: SDPA {sdpa_us:7.1f} us; default {default_us:7.1f} us "
              f"({sdpa_us / default_us:.2f}x SDPA; splits {base.num_splits}, block_n {base.block_n}, stages "
              f"{base.num_stages}); best {us:7.1f} us ({sdpa_us / us:.2f}x SDPA; splits {cfg.num_splits}, block_n "
              f"{cfg.block_n}, stages {cfg.num_stages})", flush=True)
    f.close()


if __name__ == "__main__":
    main(sys.argv[1])

"""Deeper software pipelines for the paged context kernel, on a CUDA machine:

    python tools/gpu_probes/context_stages.py OUT_DIR

Compiled offline for sm_90 (tools/gpu_compile.py's driver), the paged kernel at the bench's causal shape (head 128,
context_config's (128, 128, 8, 3)) waits for every K/V copy at the top of each iteration (`async_wait {num = 0}`):
the block-table read takes one of the pipeline's stages, so the next tile's K/V are issued only after this tile's
dots. The workspace kernel, with no table, waits with the next tile's K and V still in flight (`num = 2`). From 5
stages on, the paged kernel too leaves copies in flight (`num = 3`); no earlier sweep tried more than 4. (On an H100,
neither 4 nor 5 stages beat 3, nor did reading the table a tile ahead: results/gpu/table-prefetch-2026-12-07-h100.)
This times context_config's choice ("default") against deeper pipelines on three problems, each candidate first
checked against the torch reference on a small ragged problem:
  - the bench's causal prefill: 8 prompts x 4,096 tokens, 32 query / 8 KV heads of 128, paged bf16 and the
    workspace kernel, with torch's SDPA on the same q/k/v;
  - gemma-4-E2B's sliding layer (8/1 heads of 256, window 512) and full layer (8/1 of 512), one engine prefill
    step of 8 x 2,048 tokens, bf16 and fp8_per_token_head.
Timings: CUDA-graph replay, L2 flushed (minikv.bench.attention.cuda_time_ms). Writes context_stages.csv. ONLY=text
keeps the problems whose name contains it.
"""
import csv
import functools
import multiprocessing as mp
import os
import sys
import time

import torch

BS = 16
PROBLEMS = {   # name: (query heads, KV heads, head size, window, prompts, tokens, kernels)
    "bench causal d128": (32, 8, 128, 0, 8, 4096, ("auto", "workspace")),
    "e2b sliding d256": (8, 1, 256, 512, 8, 2048, ("auto", "fp8_per_token_head")),
    "e2b full d512": (8, 1, 512, 0, 8, 2048, ("auto", "fp8_per_token_head")),
}
if os.environ.get("ONLY"):          # problems whose name contains this
    PROBLEMS = {k: v for k, v in PROBLEMS.items() if os.environ["ONLY"] in k}
GRID = {128: [(128, 128, 8, 4), (128, 128, 8, 5), (128, 64, 8, 4), (128, 64, 8, 5)],
        256: [(128, 64, 8, 3), (128, 32, 8, 4), (64, 64, 4, 4), (64, 32, 4, 5)],
        512: [(32, 32, 4, 3), (32, 32, 4, 4), (64, 32, 4, 3), (32, 16, 4, 5)]}


def candidates(problem, kernel):
    from minikv.kernels import launch
    hq, hkv, d, _, _, tokens, _ = PROBLEMS[problem]
    one_byte = kernel not in ("auto", "workspace")
    base = launch.context_config(d, torch.bfloat16, rows_per_seq=tokens * hq // hkv,
                                 one_byte_cache=one_byte and kernel != "workspace")
    return [("default", base)] + [("grid", launch.ContextConfig(*c, f16_dot=one_byte)) for c in GRID[d]]


def build(problem, kernel, prompts=None, tokens=None, seed=0):
    from minikv.bench.attention import paged_copy
    from minikv.cache.layout import KVLayout
    hq, hkv, d, _, p, t, _ = PROBLEMS[problem]
    prompts, tokens = prompts or p, tokens or t
    torch.manual_seed(seed)
    q = torch.randn(prompts * tokens, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(prompts * tokens, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    cu = torch.arange(0, prompts + 1, dtype=torch.int32, device="cuda") * tokens
    layout = KVLayout("auto" if kernel == "workspace" else kernel, torch.bfloat16, hkv, d, BS)
    pool, tables = paged_copy(k, v, layout, prompts, tokens)
    lens = torch.full((prompts,), tokens, dtype=torch.int32, device="cuda")
    return q, k, v, cu, lens, layout, pool, tables


def call(problem, kernel, data, cfg, validate=False):
    from minikv.kernels.context_attention import context_attention, paged_context_attention
    q, k, v, cu, lens, layout, pool, tables = data
    d, window = PROBLEMS[problem][2], PROBLEMS[problem][3]
    sm = d ** -0.5
    if kernel == "workspace":
        return lambda: context_attention(q, k, v, cu, cu, True, sm, validate=validate, sliding_window=window,
                                         config=cfg)
    return lambda: paged_context_attention(q, pool, tables, cu, lens, layout, True, sm, validate=validate,
                                           sliding_window=window, config=cfg)


def check(job):
    """Compile one candidate on a small ragged problem; its max |difference| from the torch reference."""
    import minikv.kernels  # noqa: F401
    from minikv.kernels.context_attention import (context_attention_reference,
                                                  paged_context_attention_reference)
    problem, kernel, index = job
    cfg = candidates(problem, kernel)[index][1]
    q, k, v, cu, lens, layout, pool, tables = build(problem, kernel, 3, 1024)
    cu = torch.tensor([0, 1, 301, 1001], dtype=torch.int32, device="cuda")
    lens = torch.tensor([1, 300, 1000], dtype=torch.int32, device="cuda")
    d, window = PROBLEMS[problem][2], PROBLEMS[problem][3]
    q, k, v = q[:1001], k[:1001], v[:1001]
    try:
        got = call(problem, kernel, (q, k, v, cu, lens, layout, pool, tables), cfg, validate=True)()
        if kernel == "workspace":
            ref = context_attention_reference(q, k, v, cu, cu, True, d ** -0.5, sliding_window=window)
        else:
            ref = paged_context_attention_reference(q, pool, tables, cu, lens, layout, True, d ** -0.5,
                                                    sliding_window=window)
        return (got.float() - ref.float()).abs().max().item()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def _checked(diff):
    """check()'s answer, if the candidate compiled and matched the reference; else raise what went wrong."""
    if isinstance(diff, str) or diff > 0.05:
        raise RuntimeError(diff if isinstance(diff, str) else f"differs from the reference by {diff}")
    return diff


def main(out_dir):
    import torch.nn.functional as F

    from minikv.bench.attention import cuda_time_ms
    os.makedirs(out_dir, exist_ok=True)
    jobs = [(p, kern, i) for p, spec in PROBLEMS.items() for kern in spec[6] for i in range(len(candidates(p, kern)))]
    start = time.time()
    with mp.get_context("spawn").Pool(min(15, len(jobs))) as workers:
        diffs = dict(zip(jobs, workers.map(check, jobs, chunksize=1)))
    print(f"compiled and checked {len(jobs)} candidates in {time.time() - start:.0f} s", flush=True)
    with open(os.path.join(out_dir, "context_stages.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["problem", "kernel", "config", "block_m", "block_n", "warps", "stages", "us",
                               "TFLOPs", "over_default", "max_abs_diff", "error"])
        w.writeheader()
        for problem, (hq, hkv, d, window, prompts, tokens, kernels) in PROBLEMS.items():
            keys = sum(min(i + 1, window or i + 1) for i in range(tokens))
            flops = 4 * prompts * hq * d * keys
            data = build(problem, "auto")
            if not window:
                qs, ks, vs = (t.view(prompts, tokens, -1, d).transpose(1, 2) for t in data[:3])
                sdpa = functools.partial(F.scaled_dot_product_attention, qs, ks, vs, is_causal=True, scale=d ** -0.5,
                                         enable_gqa=True)
                us = 1e3 * cuda_time_ms(sdpa, reps=10).ms
                w.writerow({"problem": problem, "kernel": "torch sdpa", "config": "-", "us": us,
                            "TFLOPs": flops / us / 1e6})
                print(f"{problem:18s} torch sdpa {us:9.1f} us {flops / us / 1e6:6.1f} TFLOP/s", flush=True)
            for kernel in kernels:
                data = build(problem, kernel)
                default_us = None
                for i, (name, cfg) in enumerate(candidates(problem, kernel)):
                    r = {"problem": problem, "kernel": kernel, "config": name, "block_m": cfg.block_m,
                         "block_n": cfg.block_n, "warps": cfg.num_warps, "stages": cfg.num_stages}
                    try:
                        r["max_abs_diff"] = _checked(diffs[(problem, kernel, i)])
                        us = 1e3 * cuda_time_ms(call(problem, kernel, data, cfg), reps=10).ms
                        default_us = default_us or us
                        r.update(us=us, TFLOPs=flops / us / 1e6, over_default=default_us / us)
                        print(f"{problem:18s} {kernel:18s} {name:7s} ({cfg.block_m:3d}, {cfg.block_n:3d}, "
                              f"{cfg.num_warps}, {cfg.num_stages}) {us:9.1f} us {flops / us / 1e6:6.1f} TFLOP/s "
                              f"{default_us / us:5.2f}x default", flush=True)
                    except Exception as exc:  # noqa: BLE001
                        r["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                        print(f"{problem:18s} {kernel:18s} {name:7s} {cfg}: {r['error']}", flush=True)
                    w.writerow(r)
                    f.flush()
                del data
                torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

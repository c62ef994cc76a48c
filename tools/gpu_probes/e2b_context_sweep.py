"""Context (prefill) launch configurations at gemma-4-E2B's attention shapes, on a CUDA machine:

    python tools/gpu_probes/e2b_context_sweep.py OUT_DIR             # the sweep
    python tools/gpu_probes/e2b_context_sweep.py OUT_DIR defaults    # context_config's choice, every format

The engine's prefill runs the fused paged context kernel with 8 query heads over 1 KV head: the sliding layers at
head size 256 (window 512), the full layers at 512. Until this probe their launch configurations were sized for
shared memory only (launch.context_config). For bf16 and fp8_per_token_head (row placement) it times
context_config's own choice ("default") and a grid of (block_m, block_n, warps, stages) on one engine prefill
step of 8 prompts x 2,048 tokens, then the default and the three fastest on one prompt of 32,768 tokens. Each
candidate is first checked against the torch reference on a small ragged problem. Beside them: torch's SDPA on
the same q/k/v (flash, or whatever it picks at head 512), and torch's varlen flash with the window where this
torch has it. Timings: CUDA-graph replay, L2 flushed (minikv.bench.attention.cuda_time_ms). Writes
e2b_context_sweep.csv.
"""
import csv
import itertools
import multiprocessing as mp
import os
import sys
import time

import torch

HQ, HKV, BS = 8, 1, 16
SHAPES = ((256, 512), (512, 0))          # (head size, sliding window)
FORMATS = ("auto", "fp8_per_token_head")
GRID = {256: list(itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (2, 3))),
        512: list(itertools.product((16, 32, 64), (16, 32, 64), (4, 8), (1, 2)))}
STEP = (8, 2048)                         # (prompts, tokens each): one prefill step of the engine bench
LONG = (1, 32768)


def candidates(fmt, head_size):
    from minikv.kernels import launch
    one_byte = fmt != "auto"
    base = launch.context_config(head_size, torch.bfloat16, rows_per_seq=STEP[1] * HQ, one_byte_cache=one_byte)
    cands = [("default", base)]
    for bm, bn, w, st in GRID[head_size]:
        cands.append(("grid", launch.ContextConfig(bm, bn, w, st, f16_dot=one_byte)))
    return cands


def problem(fmt, head_size, batch, length, seed=0):
    from minikv.bench.attention import paged_copy
    from minikv.cache.layout import KVLayout
    torch.manual_seed(seed)
    fmt, _, placement = fmt.partition("/")
    layout = KVLayout(fmt, torch.bfloat16, HKV, head_size, BS, placement or "row")
    q = torch.randn(batch * length, HQ, head_size, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch * length, HKV, head_size, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    pool, tables = paged_copy(k, v, layout, batch, length)      # its block size is minikv.bench.attention.BS (16)
    cu = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * length
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    return layout, q, k, v, pool, tables, cu, lens


def check(job):
    """Compile one candidate on a small ragged problem and return its max |difference| from the reference."""
    import minikv.kernels  # noqa: F401
    from minikv.kernels.context_attention import paged_context_attention, paged_context_attention_reference
    fmt, head_size, window, index = job
    cfg = candidates(fmt, head_size)[index][1]
    layout, q, k, v, pool, tables, cu, lens = problem(fmt, head_size, 3, 1024)
    cu = torch.tensor([0, 1, 301, 1001], dtype=torch.int32, device="cuda")
    lens = torch.tensor([1, 300, 1000], dtype=torch.int32, device="cuda")
    q = q[:1001]
    try:
        got = paged_context_attention(q, pool, tables, cu, lens, layout, True, 1.0, sliding_window=window,
                                      config=cfg)
        ref = paged_context_attention_reference(q, pool, tables, cu, lens, layout, True, 1.0,
                                                sliding_window=window)
        return (got.float() - ref.float()).abs().max().item()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def peers(head_size, window, q, k, v, batch, length, cuda_time_ms):
    """{name: us} of torch's own kernels on the same q/k/v (scale 1.0, as gemma-4)."""
    import torch.nn.functional as F
    out = {}
    qs, ks, vs = (t.view(batch, length, -1, head_size).transpose(1, 2) for t in (q, k, v))
    try:
        out["sdpa causal, no window"] = 1e3 * cuda_time_ms(lambda: F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=1.0, enable_gqa=True), reps=10).ms
    except Exception as exc:  # noqa: BLE001
        out["sdpa causal, no window"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    try:
        from torch.nn.attention.varlen import varlen_attn
        cu = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * length
        ws = (window - 1, 0) if window else (-1, 0)
        out["varlen flash, as the layer"] = 1e3 * cuda_time_ms(lambda: varlen_attn(
            q, k, v, cu, cu, length, length, scale=1.0, window_size=ws, enable_gqa=True), reps=10).ms
    except Exception as exc:  # noqa: BLE001
        out["varlen flash, as the layer"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return out


def flops(head_size, window, batch, length):
    keys = sum(min(i + 1, window or i + 1) for i in range(length))
    return 4 * batch * HQ * head_size * keys


def main(out_dir):
    from minikv.bench.attention import cuda_time_ms
    from minikv.kernels.context_attention import paged_context_attention
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, "e2b_context_sweep.csv"), "w", newline="")
    w = csv.DictWriter(f, ["head_size", "window", "format", "batch", "length", "config", "block_m", "block_n",
                           "warps", "stages", "us", "TFLOPs", "max_abs_diff", "error"])
    w.writeheader()
    best_of = {}                         # (format, head size) -> [(us, candidate index)] of the step shape
    jobs = [(fmt, hs, win, i) for hs, win in SHAPES for fmt in FORMATS for i in range(len(candidates(fmt, hs)))]
    start = time.time()
    with mp.get_context("spawn").Pool(15) as workers:
        diffs = dict(zip(jobs, workers.map(check, jobs, chunksize=1)))
    print(f"compiled and checked {len(jobs)} candidates in {time.time() - start:.0f} s", flush=True)
    for head_size, window in SHAPES:
        for batch, length in (STEP, LONG):
            layout0, q, k, v, *_ = problem("auto", head_size, batch, length)
            fl = flops(head_size, window, batch, length)
            for name, us in peers(head_size, window, q, k, v, batch, length, cuda_time_ms).items():
                row = dict(head_size=head_size, window=window, format="bf16 q/k/v", batch=batch, length=length,
                           config=name)
                row.update({"us": us, "TFLOPs": fl / us / 1e6} if isinstance(us, float) else {"error": us})
                w.writerow(row)
                print(f"head {head_size} window {window} {batch}x{length}: {name}: "
                      f"{f'{us:9.1f} us ({fl / us / 1e6:6.1f} TFLOP/s)' if isinstance(us, float) else us}",
                      flush=True)
            del q, k, v
            for fmt in FORMATS:
                cands = candidates(fmt, head_size)
                layout, q, k, v, pool, tables, cu, lens = problem(fmt, head_size, batch, length)
                del k, v
                order = range(len(cands))
                if (batch, length) == LONG:      # the default and the step's three fastest
                    order = [0] + [i for _, i in sorted(best_of[(fmt, head_size)])[:3] if i != 0]
                results = []
                for i in order:
                    name, cfg = cands[i]
                    r = dict(head_size=head_size, window=window, format=fmt, batch=batch, length=length, config=name,
                             block_m=cfg.block_m, block_n=cfg.block_n, warps=cfg.num_warps, stages=cfg.num_stages)
                    diff = diffs[(fmt, head_size, window, i)]
                    try:
                        if isinstance(diff, str):
                            raise RuntimeError(diff)
                        r["max_abs_diff"] = diff
                        if diff > 0.05:
                            raise RuntimeError(f"differs from the reference by {diff}")
                        r["us"] = 1e3 * cuda_time_ms(lambda: paged_context_attention(
                            q, pool, tables, cu, lens, layout, True, 1.0, sliding_window=window, validate=False,
                            config=cfg), reps=10 if length < 32768 else 3).ms
                        r["TFLOPs"] = fl / r["us"] / 1e6
                        results.append((r["us"], i))
                    except Exception as exc:  # noqa: BLE001
                        r["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    w.writerow(r)
                    f.flush()
                if (batch, length) == STEP:
                    best_of[(fmt, head_size)] = list(results)
                results.sort()
                default_us = next((us for us, i in results if i == 0), float("nan"))
                us, i = results[0]
                cfg = cands[i][1]
                print(f"head {head_size} window {window} {batch}x{length} {fmt:20s}: default {default_us:9.1f} us; "
                      f"best {us:9.1f} us = {default_us / us:.2f}x faster ({cfg.block_m}, {cfg.block_n}, "
                      f"{cfg.num_warps}, {cfg.num_stages}) {fl / us / 1e6:6.1f} TFLOP/s", flush=True)
                del pool, q
                torch.cuda.empty_cache()
    f.close()


def defaults(out_dir):
    """The default configuration of every format and scale placement at the step shape (bf16 q)."""
    from minikv.bench.attention import cuda_time_ms
    from minikv.kernels.context_attention import paged_context_attention
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "e2b_context_defaults.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["head_size", "window", "format", "us", "TFLOPs", "over_bf16"])
        w.writeheader()
        for head_size, window in SHAPES:
            bf16_us = None
            for fmt in ("auto", "fp8", "fp8_per_token_head", "fp8_per_token_head/block", "int8_per_token_head",
                        "int8_per_token_head/block"):
                layout, q, k, v, pool, tables, cu, lens = problem(fmt, head_size, *STEP)
                us = 1e3 * cuda_time_ms(lambda: paged_context_attention(
                    q, pool, tables, cu, lens, layout, True, 1.0, sliding_window=window, validate=False),
                    reps=10).ms
                bf16_us = bf16_us or us
                fl = flops(head_size, window, *STEP)
                w.writerow(dict(head_size=head_size, window=window, format=fmt, us=us, TFLOPs=fl / us / 1e6,
                                over_bf16=us / bf16_us))
                print(f"head {head_size} window {window} {STEP[0]}x{STEP[1]} {fmt:26s}: {us:8.1f} us "
                      f"({fl / us / 1e6:6.1f} TFLOP/s, {us / bf16_us:.2f}x bf16's time)", flush=True)
                del layout, q, k, v, pool
                torch.cuda.empty_cache()


if __name__ == "__main__":
    (defaults if sys.argv[2:] == ["defaults"] else main)(sys.argv[1])

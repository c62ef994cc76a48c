"""torch's flash-attention varlen kernel beside minikv's context kernels, on a CUDA machine:

    python tools/gpu_probes/flash_context.py OUT_DIR

Issue 37's target 4 allows the 16-bit context step to run torch's flash kernel where no defect path needs the fused
one. This probe answers what that route needs and whether it pays (on an H100 with torch 2.11 it did not:
results/gpu/flash-prefill-and-full-tiles-2026-12-07-h100): whether the device's torch has
`torch.nn.attention.varlen.varlen_attn` with `window_size` and `enable_gqa`, or only the aten op it wraps
(flash_kernels below); whether a sliding window given as (window - 1, 0) keeps exactly
minikv's keys (query i sees c + i - window < j <= c + i); and how fast it is on the
problems of tools/gpu_probes/context_stages.py (the bench's causal head 128; gemma-4-E2B's sliding head 256, window
512; its full head 512, which flash-attention does not support). Each is checked against minikv's torch reference on
a small ragged problem, then timed (CUDA-graph replay, L2 flushed) beside minikv's paged kernel and SDPA.
Writes flash_context.csv.
"""
import csv
import functools
import inspect
import os
import sys

import torch


def flash_kernels() -> dict:
    """torch's entries to its flash varlen kernel, each as attend(q, k, v, cu_seqlens, max_len, scale, left): the
    public varlen_attn where it takes windows and GQA, and the aten op it wraps (its FA2 kernel takes fewer K/V heads
    than query heads as they come)."""
    kernels = {}
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    if varlen_attn is not None and {"window_size", "enable_gqa"} <= set(inspect.signature(varlen_attn).parameters):
        kernels["varlen_attn"] = lambda q, k, v, cu, n, scale, left: varlen_attn(
            q, k, v, cu, cu, n, n, scale=scale, enable_gqa=True, window_size=(left, 0))
    op = torch.ops.aten._flash_attention_forward
    if "window_size_left" in str(op.default._schema):
        kernels["aten._flash_attention_forward"] = lambda q, k, v, cu, n, scale, left: op(
            q, k, v, cu, cu, n, n, 0.0, True, False, scale=scale, window_size_left=left, window_size_right=0)[0]
    return kernels


def main(out_dir):
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(__file__))
    from context_stages import PROBLEMS, build, call, candidates

    from minikv.bench.attention import cuda_time_ms
    from minikv.kernels.context_attention import context_attention_reference
    os.makedirs(out_dir, exist_ok=True)
    try:
        from torch.nn.attention.varlen import varlen_attn
        print(f"torch {torch.__version__}: varlen_attn{inspect.signature(varlen_attn)}", flush=True)
    except ImportError as exc:
        print(f"torch {torch.__version__}: no varlen_attn ({exc})", flush=True)
    print(f"aten: {torch.ops.aten._flash_attention_forward.default._schema}", flush=True)
    entries = flash_kernels()
    print(f"minikv's entries: {list(entries)}", flush=True)
    rows = []
    for problem, (hq, hkv, d, window, prompts, tokens, _) in PROBLEMS.items():
        sm = d ** -0.5
        keys = sum(min(i + 1, window or i + 1) for i in range(tokens))
        flops = 4 * prompts * hq * d * keys
        row = {"problem": problem}
        for entry, attend in entries.items():       # correctness on a ragged batch, window included
            q, k, v, *_ = build(problem, "auto", 3, 1024)
            cu = torch.tensor([0, 1, 301, 1001], dtype=torch.int32, device="cuda")
            q, k, v = q[:1001], k[:1001], v[:1001]
            try:
                got = attend(q, k, v, cu, 700, sm, window - 1 if window else -1)
                ref = context_attention_reference(q, k, v, cu, cu, True, sm, sliding_window=window)
                row[f"{entry} max_abs_diff"] = (got.float() - ref.float()).abs().max().item()
                if window:      # one key more in the window must differ
                    off = attend(q, k, v, cu, 700, sm, window)
                    row[f"{entry} window_plus_one_diff"] = (off.float() - ref.float()).abs().max().item()
            except Exception as exc:  # noqa: BLE001
                row[f"{entry} error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        data = build(problem, "auto")
        q, k, v, cu = data[:4]
        timings = {"minikv paged": call(problem, "auto", data, candidates(problem, "auto")[0][1])}
        for entry, attend in entries.items():
            if f"{entry} error" not in row:
                timings[entry] = functools.partial(attend, q, k, v, cu, tokens, sm, window - 1 if window else -1)
        if not window:
            qs, ks, vs = (t.view(prompts, tokens, -1, d).transpose(1, 2) for t in (q, k, v))
            timings["torch sdpa"] = functools.partial(F.scaled_dot_product_attention, qs, ks, vs, is_causal=True,
                                                      scale=sm, enable_gqa=True)
        for name, f in timings.items():
            try:
                us = 1e3 * cuda_time_ms(f, reps=10).ms
                row[f"{name} us"] = us
                print(f"{problem:18s} {name:29s} {us:9.1f} us {flops / us / 1e6:6.1f} TFLOP/s", flush=True)
            except Exception as exc:  # noqa: BLE001
                row[f"{name} error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                print(f"{problem:18s} {name:29s} {row[f'{name} error']}", flush=True)
        print(f"{problem:18s} checks: " + ", ".join(f"{k} {v}" for k, v in row.items() if "diff" in k or "error" in k),
              flush=True)
        rows.append(row)
        del data
        torch.cuda.empty_cache()
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k != "problem", k))
    with open(os.path.join(out_dir, "flash_context.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

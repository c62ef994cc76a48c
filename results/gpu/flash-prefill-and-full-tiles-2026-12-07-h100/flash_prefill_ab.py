"""The engine's prefill with torch's flash kernel for fresh 16-bit steps (prefill_attention="auto") against minikv's
fused kernel everywhere ("fused"), on one E2B-like checkpoint (minikv.bench.engine.e2b_like_checkpoint), on a CUDA
machine, on a tree with flash-prefill-route.patch applied (the option is not on main):

    git apply results/gpu/flash-prefill-and-full-tiles-2026-12-07-h100/flash-prefill-route.patch
    python results/gpu/flash-prefill-and-full-tiles-2026-12-07-h100/flash_prefill_ab.py OUT_DIR

64 prompts of 2,048 random token ids, max_tokens=1, step budget 16,384 tokens; each engine is timed 3 times after a
warm-up, interleaved auto, fused, auto, fused, with and without kv_sharing_fast_prefill. Prints each run's median,
min and max, which kernel each self layer's prefill ran (the trace) and how far the first tokens agree.
"""
from __future__ import annotations

import collections
import statistics
import sys
import time
from pathlib import Path

import torch

BATCH, LENGTH, REPEATS, BUDGET = 64, 2048, 3, 16384


def run(path, choice, fast, prompts):
    import minikv
    llm = minikv.LLM(model=str(path), dtype=torch.bfloat16, device="cuda", max_num_seqs=BATCH,
                     max_num_batched_tokens=BUDGET, max_model_len=LENGTH + 16, sanitize=False,
                     kv_sharing_fast_prefill=fast, prefill_attention=choice)
    params = minikv.SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.add_request(prompts[0], params)
    first = llm.step()
    layers = collections.Counter((e.context_path, e.context_dispatch) for e in first.trace.events if e.kind == "self")
    while llm.has_unfinished():
        llm.step()
    times, tokens = [], None
    for _ in range(REPEATS + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        tokens = [o.token_ids for o in outs]
    times = times[1:]
    del llm
    torch.cuda.empty_cache()
    return statistics.median(times), min(times), max(times), layers, tokens


def main(out_dir):
    from minikv.bench.engine import e2b_like_checkpoint
    path = Path(out_dir) / "e2b-like"
    if not (path / "config.json").exists():
        e2b_like_checkpoint(path, max_position_embeddings=4096)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40, (BATCH, LENGTH), generator=g)     # the E2B-like checkpoint has 40 ids
    prompts = [{"prompt_token_ids": row} for row in ids.tolist()]
    print(f"{torch.cuda.get_device_name()}; {BATCH} prompts x {LENGTH} tokens", flush=True)
    for fast in (False, True):
        tokens = {}
        for choice in ("auto", "fused", "auto", "fused"):
            med, lo, hi, layers, tokens[choice] = run(path, choice, fast, prompts)
            print(f"kv_sharing_fast_prefill={fast!s:5s} prefill_attention={choice:5s}: median {med:.3f} s "
                  f"({BATCH * LENGTH / med / 1e3:.1f}k tokens/s; min {lo:.3f}, max {hi:.3f})", flush=True)
            for (kernel, why), n in sorted(layers.items(), key=str):
                print(f"    {n:3d} self layers: {kernel} ({why or 'torch flash'})", flush=True)     # see the README
        same = sum(a == b for a, b in zip(tokens["auto"], tokens["fused"]))
        print(f"  first tokens equal in {same} of {BATCH} prompts", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

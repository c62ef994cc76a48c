"""Where an engine step's GPU time goes, at gemma-4-E2B's dimensions (random weights), on a CUDA machine.

    python tools/gpu_probes/engine_step_profile.py steps OUT_DIR [CONTEXT]   # torch.profiler: kernel time
    python tools/gpu_probes/engine_step_profile.py kernels          # E2B-shaped decode launches, for ncu

`steps`: for each format, the engine of `minikv.bench engine` (batch 64, every prompt CONTEXT tokens, prefill
steps of 16,384 tokens) is run eagerly (enforce_eager=True: the same kernels a CUDA graph replays, one launch at a
time) and torch.profiler records one prefill step and three decode steps; each kernel's CUDA time is put in a
category by its name; beside it, the median wall time of the steps not profiled. Prints a table per phase and
writes steps_CONTEXT.csv (format, phase, category, ms per step, share of the kernel time).
`kernels`: the decode kernel at the E2B full layer's shape (8 query heads, 1 KV head of 512) and sliding layer's
(1 KV head of 256, window 512), batch 64, context CONTEXT, each format launched twice (the first compiles).
"""
import collections
import csv
import os
import random
import statistics
import sys
import tempfile
import time

import torch

CONTEXT = 8192
BATCH = 64
TOP = int(os.environ.get("TOP", "12"))      # kernels listed per phase, by time, with their launches per step
FORMATS = tuple(os.environ.get("FORMATS", "auto fp8 int8_per_token_head fp8_per_token_head").split())
CATEGORIES = (("decode attention", ("decode_kernel", "decode_row", "merge_splits")),
              ("context attention", ("context_kernel", "_context")),
              ("KV cache write", ("write", "cache_")),
              ("matmul", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "matmul", "splitK", "sm90")),
              ("other", ("",)))


def category(name: str) -> str:
    low = name.lower()
    return next(cat for cat, keys in CATEGORIES if any(k.lower() in low for k in keys))


def steps(out_dir: str) -> None:
    import minikv
    from minikv.bench.engine import PREFILL_TOKENS_PER_STEP, e2b_like_checkpoint
    from torch.profiler import ProfilerActivity, profile
    os.makedirs(out_dir, exist_ok=True)
    path = tempfile.mkdtemp()
    e2b_like_checkpoint(path, max_position_embeddings=CONTEXT + 64)
    rows = []
    for fmt in FORMATS:
        llm = minikv.LLM(model=path, kv_cache_dtype=fmt, device="cuda", dtype=torch.bfloat16, max_num_seqs=BATCH,
                         max_num_batched_tokens=PREFILL_TOKENS_PER_STEP, sanitize=False, enforce_eager=True)
        rng = random.Random(0)
        prompts = ["".join(rng.choice("0123456789 ") for _ in range(CONTEXT)) for _ in range(BATCH)]
        per_step = PREFILL_TOKENS_PER_STEP // CONTEXT
        llm.generate(prompts[:per_step], minikv.SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
        for p in prompts:
            llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        profiled = {"prefill": 0, "decode": 0}
        totals = {"prefill": collections.Counter(), "decode": collections.Counter()}
        names = {"prefill": collections.Counter(), "decode": collections.Counter()}
        counts = {"prefill": collections.Counter(), "decode": collections.Counter()}
        launches = {"prefill": collections.Counter(), "decode": collections.Counter()}
        decode_seen = 0
        walls = {"prefill": [], "decode": []}
        while llm.has_unfinished():
            phase_next = "decode" if not llm.scheduler.waiting else "prefill"
            want = (phase_next == "prefill" and profiled["prefill"] == 0 and decode_seen == 0 and
                    llm.scheduler.running) or (phase_next == "decode" and decode_seen >= 2 and profiled["decode"] < 3)
            if not want:
                start = time.perf_counter()
                out = llm.step()
                walls[out.phase].append(time.perf_counter() - start)   # the sampled ids are on the host: done
                decode_seen += out.phase == "decode"
                continue
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out = llm.step()
                torch.cuda.synchronize()
            decode_seen += out.phase == "decode"
            profiled[out.phase] += 1
            for evt in prof.key_averages():
                if evt.device_type == torch.autograd.DeviceType.CUDA:        # kernels (and copies) only
                    t = evt.self_device_time_total / 1e3
                    totals[out.phase][category(evt.key)] += t
                    names[out.phase][evt.key[:90]] += t
                    counts[out.phase][evt.key[:90]] += evt.count
                    launches[out.phase][category(evt.key)] += evt.count
        for phase in ("prefill", "decode"):
            n = max(1, profiled[phase])
            whole = sum(totals[phase].values()) / n
            wall = 1e3 * statistics.median(walls[phase]) if walls[phase] else float("nan")
            count = sum(launches[phase].values()) / n
            print(f"{fmt} {phase}: {whole:.2f} ms of kernels per step in {count:.0f} launches ({n} step(s) "
                  f"profiled); wall {wall:.2f} ms per step (median of {len(walls[phase])} unprofiled steps, eager)",
                  flush=True)
            rows.append(dict(format=fmt, phase=phase, category="wall (unprofiled, median)", ms_per_step=wall,
                             share=wall / max(whole, 1e-9)))
            for cat, _ in CATEGORIES:
                ms = totals[phase][cat] / n
                k = launches[phase][cat] / n
                rows.append(dict(format=fmt, phase=phase, category=cat, ms_per_step=ms, share=ms / max(whole, 1e-9),
                                 launches_per_step=k))
                print(f"    {cat:18s} {ms:8.3f} ms  {100 * ms / max(whole, 1e-9):5.1f}%  {k:6.0f} launches",
                      flush=True)
            for name, t in names[phase].most_common(TOP):
                print(f"      top: {t / n:8.3f} ms {counts[phase][name] / n:5.0f}x  {name}", flush=True)
        del llm
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, f"steps_{CONTEXT}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["format", "phase", "category", "ms_per_step", "share", "launches_per_step"])
        w.writeheader()
        w.writerows(rows)


def kernels() -> None:
    from minikv.bench.attention import fill_pool
    from minikv.cache.layout import KVLayout
    from minikv.kernels import paged_decode_attention
    for head_size, window in ((512, 0), (256, 512)):
        for fmt in FORMATS:
            name, _, placement = fmt.partition("/")         # "fp8_per_token_head/block": the block placement
            layout = KVLayout(name, torch.bfloat16, 1, head_size, 16, placement or "row")
            blocks = BATCH * CONTEXT // 16
            pool = torch.empty(blocks, layout.block_bytes, dtype=torch.uint8, device="cuda")
            fill_pool(pool, layout)
            tables = torch.randperm(blocks, device="cuda").to(torch.int32).view(BATCH, CONTEXT // 16)
            lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32, device="cuda")
            q = torch.randn(BATCH, 8, head_size, dtype=torch.bfloat16, device="cuda")
            print(f"head {head_size} window {window} {fmt}", file=sys.stderr, flush=True)
            for _ in range(2):
                paged_decode_attention(q, pool, tables, lens, layout, head_size ** -0.5, sliding_window=window,
                                       validate=False)
            torch.cuda.synchronize()
            del pool


if __name__ == "__main__":
    if len(sys.argv) > 3:
        CONTEXT = int(sys.argv[3])
    steps(sys.argv[2]) if sys.argv[1] == "steps" else kernels()

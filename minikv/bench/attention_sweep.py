"""`python -m minikv.bench.attention_sweep --out DIR`: sweep launch configurations of the attention kernels (GPU).
See docs/internals.md#bench-attention-sweep."""
from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch

FORMATS = ("fp8_per_token_head", "int8_per_token_head")          # in the "row" placement
FAMILY = {"fp8_per_token_head": "per_token_head", "int8_per_token_head": "per_token_head"}
HQ, HKV, D, BS = 32, 8, 128, 16
SHAPES_A = ((64, 4096), (16, 16384))
BATCHES, CONTEXTS = (1, 16, 64, 256), (512, 4096, 16384)
LONG = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 4), (64, 64, 4, 3),
        (64, 128, 4, 3), (256, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 4)]
SHORT = [(32, 4, 3), (64, 4, 3), (64, 4, 4), (128, 4, 3), (64, 8, 3), (128, 8, 3), (32, 4, 5), (64, 2, 3)]


def decode_candidates(fmt: str) -> list[tuple]:
    """(block_n, warps, stages, row_window) per format."""
    return [(n, w, st, window) for n, w, st in itertools.product((64, 128), (4, 8), (3, 4, 5))
            for window in (True, False)]


def _decode_problem(fmt, batch, ctx):
    from minikv.bench.attention import fill_pool, layout_for
    layout = layout_for(fmt)
    num_blocks = batch * (ctx // BS)
    pool = torch.empty(num_blocks, layout.block_bytes, dtype=torch.uint8, device="cuda")
    fill_pool(pool, layout)
    tables = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, ctx // BS)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device="cuda")
    return layout, pool, tables, lens, q, torch.empty_like(q)


def _decode_call(problem, cfg):
    from minikv.kernels.decode_attention import paged_decode_attention
    layout, pool, tables, lens, q, out = problem
    return lambda: paged_decode_attention(q, pool, tables, lens, layout, D ** -0.5, out=out, validate=False,
                                          config=cfg)


def _cfg(block_n, warps, stages, row_window, splits):
    from minikv.kernels.launch import DecodeConfig
    return DecodeConfig(16, block_n, splits, warps, stages, f16_dot=True, convert_asm=True, row_window=row_window)


# ---- context ---------------------------------------------------------------------------------------------------
def _context_problems():
    """name -> (callable, flops) for the context shapes; built lazily per process."""
    from minikv.bench.attention import paged_copy
    from minikv.cache.layout import KVLayout
    from minikv.kernels.context_attention import context_attention, paged_context_attention
    dt, sm = torch.bfloat16, D ** -0.5
    out = {}
    b, n = 8, 4096
    q = torch.randn(b * n, HQ, D, dtype=dt, device="cuda")
    k = torch.randn(b * n, HKV, D, dtype=dt, device="cuda")
    v = torch.randn_like(k)
    cu = torch.arange(0, b + 1, dtype=torch.int32, device="cuda") * n
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    lay = KVLayout("auto", dt, HKV, D, BS)
    pool, tables = paged_copy(k, v, lay, b, n)
    causal_flops = 4 * b * HQ * n * n * D / 2
    out["causal workspace"] = (lambda cfg: context_attention(q, k, v, cu, cu, True, sm, validate=False, config=cfg),
                               causal_flops)
    out["causal paged bf16"] = (lambda cfg: paged_context_attention(q, pool, tables, cu, lens, lay, True, sm,
                                                                    validate=False, config=cfg), causal_flops)
    for batch, qlen, enc in ((64, 1, 1024), (8, 512, 4096)):
        qq = torch.randn(batch * qlen, HQ, D, dtype=dt, device="cuda")
        kk = torch.randn(batch * enc, HKV, D, dtype=dt, device="cuda")
        vv = torch.randn_like(kk)
        cq = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * qlen
        ck = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * enc
        fl = KVLayout("fp8", dt, HKV, D, BS)
        fpool, ftables = paged_copy(kk, vv, fl, batch, enc)
        flens = torch.full((batch,), enc, dtype=torch.int32, device="cuda")
        flops = 4 * batch * HQ * qlen * enc * D
        tag = f"cross b{batch} q{qlen} enc{enc}"
        out[f"{tag} fused fp8"] = (lambda cfg, qq=qq, fpool=fpool, ftables=ftables, cq=cq, flens=flens, fl=fl:
                                   paged_context_attention(qq, fpool, ftables, cq, flens, fl, False, sm,
                                                           validate=False, config=cfg), flops)
        out[f"{tag} unfused bf16"] = (lambda cfg, qq=qq, kk=kk, vv=vv, cq=cq, ck=ck:
                                      context_attention(qq, kk, vv, cq, ck, False, sm, validate=False, config=cfg),
                                      flops)
    return out


def _context_cases(only: str = ""):
    """(problem name, ContextConfig) pairs to try; `only`: keep the problems whose name contains it."""
    from minikv.kernels.launch import ContextConfig
    cases = []
    for name in ("causal workspace", "causal paged bf16", "cross b8 q512 enc4096 unfused bf16"):
        cases += [(name, ContextConfig(*c)) for c in LONG]
    cases += [("cross b8 q512 enc4096 fused fp8", ContextConfig(*c, f16)) for c in LONG for f16 in (False, True)]
    cases += [("cross b64 q1 enc1024 unfused bf16", ContextConfig(16, *c)) for c in SHORT]
    cases += [("cross b64 q1 enc1024 fused fp8", ContextConfig(16, *c, f16)) for c in SHORT for f16 in (False, True)]
    return [c for c in cases if only in c[0]]


# ---- parallel compile ------------------------------------------------------------------------------------------
def _compile_worker(args):
    index, jobs = args
    import minikv.kernels  # noqa: F401 - mode set-up before triton use
    done, failed = 0, []
    problems, ctx_problems = {}, None
    for job in jobs:
        try:
            if job[0] == "decode":
                _, fmt, cand, splits = job
                if fmt not in problems:
                    problems[fmt] = _decode_problem(fmt, 2, 4096)
                _decode_call(problems[fmt], _cfg(*cand, splits))()
            else:
                _, name, cfg = job
                if ctx_problems is None:
                    ctx_problems = _context_problems()
                ctx_problems[name][0](cfg)
            torch.cuda.synchronize()
            done += 1
        except Exception as exc:  # noqa: BLE001 - a config may not fit; the timing loop reports it again
            failed.append(f"{job}: {type(exc).__name__}: {str(exc)[:120]}")
    return done, failed


def precompile(workers: int, decode: bool = True, context: bool = True, only: str = "") -> None:
    jobs = []
    for fmt in FORMATS if decode else ():
        for cand in decode_candidates(fmt):
            for splits in (1, 2):
                jobs.append(("decode", fmt, cand, splits))
    jobs += [("context", name, cfg) for name, cfg in _context_cases(only)] if context else []
    chunks = [(i, jobs[i::workers]) for i in range(workers)]
    start = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        results = pool.map(_compile_worker, chunks)
    failed = [f for _, fs in results for f in fs]
    print(f"precompiled {sum(d for d, _ in results)} of {len(jobs)} jobs in {time.time() - start:.0f} s; "
          f"{len(failed)} failed", flush=True)
    for f in failed[:20]:
        print("  failed:", f, flush=True)


# ---- timing ----------------------------------------------------------------------------------------------------
def _time(fn, reps=10) -> float:
    """Milliseconds (the median of `reps` CUDA-graph replays, L2 flushed)."""
    from minikv.bench.attention import cuda_time_ms
    return cuda_time_ms(fn, reps=reps).ms


class _Writer:
    def __init__(self, path, keys):
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=keys)
        self.w.writeheader()

    def row(self, r):
        self.w.writerow(r)
        self.f.flush()


def sweep_decode(out_dir: str, top: int = 3, quick: bool = False) -> dict:
    from minikv.bench.attention import sdpa_decode_ms
    keys = ["stage", "format", "batch", "context", "block_n", "warps", "stages", "row_window", "splits", "us",
            "sdpa_us", "error"]
    w = _Writer(os.path.join(out_dir, "decode_sweep.csv"), keys)
    score = {fmt: {} for fmt in FORMATS}           # candidate -> sum of log(best time) over the stage-A shapes
    for batch, ctx in SHAPES_A[:1] if quick else SHAPES_A:
        for fmt in FORMATS:
            problem = _decode_problem(fmt, batch, ctx)
            for cand in decode_candidates(fmt):
                best = math.inf
                for splits in (1, 2) if quick else (1, 2, 4, 8):
                    r = dict(stage="A", format=fmt, batch=batch, context=ctx, block_n=cand[0], warps=cand[1],
                             stages=cand[2], row_window=cand[3], splits=splits)
                    try:
                        r["us"] = 1e3 * _time(_decode_call(problem, _cfg(*cand, splits)))
                        best = min(best, r["us"])
                    except Exception as exc:  # noqa: BLE001
                        r["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
                        torch.cuda.synchronize()
                    w.row(r)
                score[fmt][cand] = score[fmt].get(cand, 0.0) + math.log(best)
            del problem
            torch.cuda.empty_cache()
        print(f"stage A {batch}x{ctx} done", flush=True)
    finalists = {fmt: sorted(s, key=s.get)[:top] for fmt, s in score.items()}
    print("finalists:", json.dumps({f: [list(c) for c in cs] for f, cs in finalists.items()}), flush=True)
    if quick:
        return {fmt: [list(c) for c in cs] for fmt, cs in finalists.items()}
    best = {}
    for batch in BATCHES:
        for ctx in CONTEXTS:
            sdpa = 1e3 * sdpa_decode_ms(batch, ctx)
            for fmt in FORMATS:
                problem = _decode_problem(fmt, batch, ctx)
                for cand in finalists[fmt]:
                    for splits in (1, 2, 4, 8, 16, 32, 64):
                        if splits > 1 and (ctx // cand[0] < 2 * splits or batch * HKV * splits > 65536):
                            continue
                        r = dict(stage="B", format=fmt, batch=batch, context=ctx, block_n=cand[0], warps=cand[1],
                                 stages=cand[2], row_window=cand[3], splits=splits, sdpa_us=sdpa)
                        try:
                            r["us"] = 1e3 * _time(_decode_call(problem, _cfg(*cand, splits)))
                            key = (FAMILY[fmt], fmt, batch, ctx)
                            if key not in best or r["us"] < best[key][0]:
                                best[key] = (r["us"], [cand[0], cand[1], cand[2], splits, cand[3]])
                        except Exception as exc:  # noqa: BLE001
                            r["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
                            torch.cuda.synchronize()
                        w.row(r)
                del problem
                torch.cuda.empty_cache()
            line = "  ".join(f"{fmt} {best[(FAMILY[fmt], fmt, batch, ctx)][0]:.1f}" for fmt in FORMATS
                             if (FAMILY[fmt], fmt, batch, ctx) in best)
            print(f"B {batch:4d} x {ctx:5d}: sdpa {sdpa:.1f}  {line}", flush=True)
    return {"|".join(map(str, k)): v for k, v in best.items()}


def sweep_context(out_dir: str, only: str = "") -> dict:
    import torch.nn.functional as F
    w = _Writer(os.path.join(out_dir, "context_sweep.csv"), ["case", "config", "ms", "TFLOPs", "error"])
    problems = _context_problems()
    best = {}
    for name, cfg in _context_cases(only):
        fn, flops = problems[name]
        r = {"case": name, "config": json.dumps(dataclasses.astuple(cfg))}
        try:
            r["ms"] = _time(lambda: fn(cfg))
            r["TFLOPs"] = flops / r["ms"] / 1e9
            if name not in best or r["ms"] < best[name][0]:
                best[name] = (r["ms"], dataclasses.astuple(cfg))
        except Exception as exc:  # noqa: BLE001
            r["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
            torch.cuda.synchronize()
        w.row(r)
    b, n = 8, 4096
    qs, ks, vs = (torch.randn(b, h, n, D, dtype=torch.bfloat16, device="cuda") for h in (HQ, HKV, HKV))
    ms = _time(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True))
    w.row({"case": "causal torch SDPA", "config": "", "ms": ms, "TFLOPs": 4 * b * HQ * n * n * D / 2 / ms / 1e9})
    best["causal torch SDPA"] = (ms, None)
    for name, (ms, cfg) in best.items():
        print(f"context best {name:40s} {ms:8.3f} ms  {cfg}", flush=True)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minikv.bench.attention_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="build/sweep")
    p.add_argument("--workers", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)))
    p.add_argument("--skip", nargs="*", default=[], choices=["compile", "decode", "context"])
    p.add_argument("--only", default="", help="context problems whose name contains this (e.g. 'fused')")
    p.add_argument("--quick", action="store_true", help="decode: stage A at batch 64 / context 4096 only, splits 1-2")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("the sweep needs a CUDA GPU")
        return 0
    os.makedirs(args.out, exist_ok=True)
    if "compile" not in args.skip:
        precompile(args.workers, "decode" not in args.skip, "context" not in args.skip, args.only)
    best = {}
    if "decode" not in args.skip:
        best["decode"] = sweep_decode(args.out, quick=args.quick)
    if "context" not in args.skip:
        best["context"] = {k: v for k, v in sweep_context(args.out, args.only).items()}
    with open(os.path.join(args.out, "best.json"), "w") as f:
        json.dump(best, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m minikv.bench.placement_sweep --out DIR [--bench]`: decode launch sweep for the "block" scale placement.

The per-token-head formats with KVLayout(scale_placement="block") have 16-byte aligned rows and one contiguous
scale vector per block and head, so they want other launch configurations than vLLM's row layout (whose entries in
kernels/launch.py DECODE_TUNED come from `minikv.bench.attention_sweep`). This is a short version of that sweep for
the two "/block" formats only, with the same timing (CUDA graphs, L2 flushed):

1. compile every candidate in parallel processes;
2. stage A: every candidate, splits 1-8, at batch 64 / context 4096 and batch 16 / context 16384;
3. stage B: the best `--top` candidates at every shape of `python -m minikv.bench attention`, splits 1-64.

Writes placement_sweep.csv and placement_best.json (the DECODE_TUNED entries, printed too) under --out. With
--bench, then runs `python -m minikv.bench attention` in the same process with those entries in DECODE_TUNED,
writing gpu_attention.csv, and prints the registers and spills of every compiled decode kernel.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch

from minikv.bench import attention_sweep as sw

FORMATS = ("int8_per_token_head/block", "fp8_per_token_head/block")
# (block_n, warps, stages, prefetch, words, f16_dot): word loads at three tile sizes (smaller tiles hold fewer
# registers), and the byte-wise kernel with and without scales loaded a tile ahead
CANDIDATES = ([(n, w, st, False, True, True) for n in (32, 64, 128) for w in (2, 4) for st in (1, 2)]
              + [(64, 2, 1, False, True, False), (128, 4, 2, False, True, False), (64, 8, 1, False, True, True),
                 (128, 8, 2, False, True, True)]
              + [(128, 4, 2, True, False, True), (128, 4, 3, False, False, True), (64, 4, 3, False, False, True),
                 (64, 4, 2, True, False, True)])


def precompile(workers: int) -> None:
    jobs = [("decode", fmt, cand, splits) for fmt in FORMATS for cand in CANDIDATES for splits in (1, 2)]
    start = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        results = pool.map(sw._compile_worker, [(i, jobs[i::workers]) for i in range(workers)])
    failed = [f for _, fs in results for f in fs]
    print(f"precompiled {sum(d for d, _ in results)} of {len(jobs)} in {time.time() - start:.0f} s; "
          f"{len(failed)} failed", flush=True)
    for f in failed[:10]:
        print("  failed:", f, flush=True)


def _measure(w, stage, fmt, batch, ctx, problem, cand, splits, extra=None) -> float:
    r = dict(stage=stage, format=fmt, batch=batch, context=ctx, block_n=cand[0], warps=cand[1], stages=cand[2],
             prefetch=cand[3], words=cand[4], f16=cand[5], splits=splits, **(extra or {}))
    try:
        with sw._pinned_decode(sw._cfg(*cand, splits)):
            r["us"] = 1e3 * sw._time(sw._decode_call(problem))
    except Exception as exc:  # noqa: BLE001 - a config may not fit
        r["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
        torch.cuda.synchronize()
    w.row(r)
    return r.get("us", math.inf)


def sweep(out_dir: str, top: int) -> dict[str, dict[str, list]]:
    keys = ["stage", "format", "batch", "context", "block_n", "warps", "stages", "prefetch", "words", "f16",
            "splits", "us", "error"]
    w = sw._Writer(os.path.join(out_dir, "placement_sweep.csv"), keys)
    score = {fmt: {} for fmt in FORMATS}
    for batch, ctx in sw.SHAPES_A:
        for fmt in FORMATS:
            problem = sw._decode_problem(fmt, batch, ctx)
            for cand in CANDIDATES:
                best = min(_measure(w, "A", fmt, batch, ctx, problem, cand, s) for s in (1, 2, 4, 8))
                score[fmt][cand] = score[fmt].get(cand, 0.0) + math.log(best)
            del problem
            torch.cuda.empty_cache()
        print(f"stage A {batch}x{ctx} done", flush=True)
    finalists = {fmt: sorted(s, key=s.get)[:top] for fmt, s in score.items()}
    print("finalists:", json.dumps({f: [list(c) for c in cs] for f, cs in finalists.items()}), flush=True)
    best: dict[str, dict[str, list]] = {fmt: {} for fmt in FORMATS}
    for batch in sw.BATCHES:
        for ctx in sw.CONTEXTS:
            line = []
            for fmt in FORMATS:
                problem = sw._decode_problem(fmt, batch, ctx)
                winner = (math.inf, None)
                for cand in finalists[fmt]:
                    for splits in (1, 2, 4, 8, 16, 32, 64):
                        if splits > 1 and (ctx // cand[0] < 2 * splits or batch * sw.HKV * splits > 65536):
                            continue
                        us = _measure(w, "B", fmt, batch, ctx, problem, cand, splits)
                        if us < winner[0]:
                            winner = (us, [cand[0], cand[1], cand[2], splits, cand[3], cand[4], cand[5]])
                best[fmt][f"{batch},{ctx}"] = [winner[0], winner[1]]
                line.append(f"{fmt} {winner[0]:.1f} us {winner[1]}")
                del problem
                torch.cuda.empty_cache()
            print(f"B {batch:4d} x {ctx:5d}: " + "  ".join(line), flush=True)
    return best


def install(best: dict[str, dict[str, list]]) -> None:
    """Put the sweep's winners into DECODE_TUNED (this process only) and print them as the table's source."""
    from minikv.kernels import launch
    for fmt, shapes in best.items():
        table = {tuple(int(x) for x in key.split(",")): tuple(cfg) for key, (_, cfg) in shapes.items() if cfg}
        launch.DECODE_TUNED[fmt] = table
        print(f'    "{fmt}": {{')
        for (b, c), cfg in sorted(table.items()):
            print(f"        ({b}, {c}): {cfg},")
        print("    },")


def report_registers() -> None:
    """Registers and spills of every compiled decode kernel in this process (Triton's compiled metadata)."""
    from minikv.kernels import decode_attention as da
    for name in ("_decode_kernel", "_decode_words_kernel"):
        fn = getattr(da, name)
        for caches in getattr(fn, "device_caches", {}).values():
            for kernel in caches[0].values():
                try:
                    c = {k: v for k, v in kernel.src.constants.items() if isinstance(v, (int, str))}
                    print(f"{name}: regs {kernel.n_regs} spills {kernel.n_spills} warps {kernel.metadata.num_warps} "
                          f"stages {kernel.metadata.num_stages} {c}", flush=True)
                except Exception as exc:  # noqa: BLE001 - Triton's internals differ between versions
                    print(f"{name}: {type(exc).__name__}: {exc}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minikv.bench.placement_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="build/placement")
    p.add_argument("--workers", type=int, default=max(1, min(15, (os.cpu_count() or 2) - 1)))
    p.add_argument("--top", type=int, default=2)
    p.add_argument("--bench", action="store_true", help="then run `python -m minikv.bench attention` with them")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("the sweep needs a CUDA GPU")
        return 0
    os.makedirs(args.out, exist_ok=True)
    precompile(args.workers)
    best = sweep(args.out, args.top)
    with open(os.path.join(args.out, "placement_best.json"), "w") as f:
        json.dump(best, f, indent=1)
    from minikv.kernels import launch
    original = dict(launch.DECODE_TUNED)
    install(best)
    try:
        if args.bench:
            from minikv.bench import attention
            rows = attention.run(log=lambda line: print(line, flush=True))
            attention.write_csv(rows, os.path.join(args.out, "gpu_attention.csv"))
            report_registers()
    finally:
        launch.DECODE_TUNED.clear()
        launch.DECODE_TUNED.update(original)       # the tables as shipped, for anything else in this process
    return 0


if __name__ == "__main__":
    sys.exit(main())

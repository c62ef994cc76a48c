"""`python -m minikv.bench attention`: paged attention on a GPU against the hardware and torch SDPA.
See docs/internals.md#bench-attention."""
from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import sys

import torch

from minikv.bench.timing import (NOISY, REMEASURES, Timing, ceilings, format_ratio,  # noqa: F401 (re-exported)
                                 time_ms)

FORMATS = ("auto", "fp8", "fp8_per_token_head", "int8_per_token_head", "fp8_per_token_head/block",
           "int8_per_token_head/block")


def layout_for(name: str, dtype: torch.dtype = torch.bfloat16):
    """The KVLayout of a benchmark format name: a kv_cache_dtype, with "/block" for the block scale placement."""
    from minikv.cache.layout import KVLayout
    kv_cache_dtype, _, placement = name.partition("/")
    return KVLayout(kv_cache_dtype, dtype, HKV, D, BS, placement or "row")
HQ, HKV, D, BS = 32, 8, 128, 16


def cuda_time_ms(fn, reps: int = 20, graph: bool = True) -> Timing:
    """GPU time of `fn`: CUDA events, L2 flushed, replayed from a CUDA graph where it can be captured."""
    return time_ms(fn, "cuda", reps=reps, graph=graph)


def fill_pool(pool: torch.Tensor, layout, seed: int = 0) -> None:
    """Valid random contents for every row of the pool (codes in range, finite scales), a chunk of blocks at a time."""
    torch.manual_seed(seed)
    k_codes, v_codes = layout.code_views(pool)
    chunk = 2048
    for start in range(0, k_codes.shape[0], chunk):
        for codes in (k_codes, v_codes):
            part = codes[start:start + chunk]
            values = torch.randn(part.shape, device=pool.device)
            if layout.code_dtype == torch.int8:
                part.copy_(values.mul(40).round().clamp(-127, 127).to(torch.int8))
            else:
                part.copy_(values.to(layout.code_dtype))
    if layout.has_inline_scales:
        for s in layout.scale_views(pool):
            s.fill_(0.01)


def decode_launch(layout, batch: int, ctx: int) -> dict:
    """The launch configuration paged_decode_attention takes for this layout and shape (and whether the "row"
    placement is read in aligned pieces)."""
    from minikv.kernels import launch
    cfg = launch.decode_config(batch, HKV, HQ // HKV, D, layout.elem_bytes, ctx, torch.device("cuda"),
                               fmt=layout.fmt, placement=layout.placement)
    window = cfg.row_window and layout.has_inline_scales and layout.scale_placement == "row"
    return {"kernel": "row-window" if window else "pipelined", "splits": cfg.num_splits, "block_n": cfg.block_n,
            "stages": cfg.num_stages}


def decode_problem(fmt: str, batch: int, ctx: int):
    """(layout, pool, tables, lens, q, out) of one decode case: the pool filled, blocks in shuffled order."""
    layout = layout_for(fmt, torch.bfloat16)
    blocks_per_seq = ctx // BS
    num_blocks = batch * blocks_per_seq
    pool = torch.empty(num_blocks, layout.block_bytes, dtype=torch.uint8, device="cuda")
    fill_pool(pool, layout)
    tables = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, blocks_per_seq)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device="cuda")
    return layout, pool, tables, lens, q, torch.empty_like(q)


def decode_case(fmt: str, batch: int, ctx: int, peer=None) -> dict:
    """One decode row; with `peer` (a flashinfer_peer.FlashInferDecode), its figures on the same problem too."""
    from minikv.kernels.decode_attention import paged_decode_attention
    layout, pool, tables, lens, q, out = decode_problem(fmt, batch, ctx)
    sm = D ** -0.5
    timing = cuda_time_ms(lambda: paged_decode_attention(q, pool, tables, lens, spec=layout, sm_scale=sm, out=out,
                                                     validate=False))
    ms, how = timing
    nbytes = batch * ctx * layout.bytes_per_token() + 2 * q.numel() * q.element_size() + tables.numel() * 4
    row = {"kind": "decode", "format": fmt, "batch": batch, "context": ctx, "ms": ms,
           "GBps": nbytes / ms / 1e6, "bytes": nbytes, "timing": how, **timing.columns(),
           **decode_launch(layout, batch, ctx)}
    if peer is not None and layout.scale_placement == "row":
        row.update(peer.measure(layout, pool, tables, lens, q, sm, out, cuda_time_ms))
        if "flashinfer_ms" in row:
            row["flashinfer_over_minikv"] = row["flashinfer_ms"] / ms
    return row


def sdpa_decode_ms(batch: int, ctx: int) -> Timing:
    import torch.nn.functional as F
    q = torch.randn(batch, HQ, 1, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, HKV, ctx, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    return cuda_time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def paged_copy(k, v, layout, batch, length):
    """Write K/V [batch*length, HKV, D] into a fresh pool with shuffled blocks; return (pool, tables)."""
    from minikv.kernels.cache_write import write_kv
    nb = batch * length // BS
    pool = torch.empty(nb, layout.block_bytes, dtype=torch.uint8, device="cuda")
    tables = torch.randperm(nb, device="cuda").to(torch.int32).view(batch, length // BS)
    slots = (tables.long()[:, :, None] * BS + torch.arange(BS, device="cuda")).reshape(-1)
    write_kv(k, v, pool, slots, layout, validate=False)
    return pool, tables


def prefill_cases(batch: int = 8, length: int = 4096) -> list[dict]:
    import torch.nn.functional as F

    from minikv.cache.layout import KVLayout
    from minikv.kernels.context_attention import context_attention, paged_context_attention
    dtype, sm = torch.bfloat16, D ** -0.5
    q = torch.randn(batch * length, HQ, D, dtype=dtype, device="cuda")
    k = torch.randn(batch * length, HKV, D, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    cu = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * length
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    flops = 4 * batch * HQ * length * length * D / 2           # causal: half of the score matrix
    layout = KVLayout("auto", dtype, HKV, D, BS)
    pool, tables = paged_copy(k, v, layout, batch, length)
    qs, ks, vs = (t.view(batch, length, -1, D).transpose(1, 2) for t in (q, k, v))
    cases = {
        "self causal, workspace (unfused)": lambda: context_attention(q, k, v, cu, cu, causal=True, sm_scale=sm,
                                                                     validate=False),
        "self causal, paged bf16 (fused)": lambda: paged_context_attention(q, pool, tables, cu, lens, spec=layout,
                                                                           causal=True, sm_scale=sm, validate=False),
        "self causal, torch SDPA": lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                                          enable_gqa=True),
    }
    rows = []
    for name, fn in cases.items():
        timing = cuda_time_ms(fn, reps=10)
        ms, how = timing
        rows.append({"kind": "prefill", "format": name, "batch": batch, "context": length, "q_len": length,
                     "ms": ms, "TFLOPs": flops / ms / 1e9, "timing": how, **timing.columns()})
    return rows


def cross_context_cases(shapes=((64, 1, 1024), (64, 16, 1024), (32, 64, 2048), (16, 128, 4096), (8, 256, 4096),
                               (8, 512, 4096))) -> list[dict]:
    """The cross-attention context step over (batch, q_len, encoder) shapes: fused (reads the fp8 paged cross
    cache) vs unfused (bf16 workspace)."""
    from minikv.attention.cross import context_path_for
    from minikv.cache.layout import KVLayout
    from minikv.kernels.context_attention import context_attention, paged_context_attention
    dtype, sm = torch.bfloat16, D ** -0.5
    rows = []
    for batch, qlen, enc in shapes:
        q = torch.randn(batch * qlen, HQ, D, dtype=dtype, device="cuda")
        k = torch.randn(batch * enc, HKV, D, dtype=dtype, device="cuda")
        v = torch.randn_like(k)
        cu_q = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * qlen
        cu_k = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * enc
        layout = KVLayout("fp8", dtype, HKV, D, BS)
        pool, tables = paged_copy(k, v, layout, batch, enc)
        lens = torch.full((batch,), enc, dtype=torch.int32, device="cuda")
        flops = 4 * batch * HQ * qlen * enc * D
        fused_t = cuda_time_ms(lambda: paged_context_attention(
            q, pool, tables, cu_q, lens, spec=layout, causal=False, sm_scale=sm, validate=False))
        unfused_t = cuda_time_ms(lambda: context_attention(
            q, k, v, cu_q, cu_k, causal=False, sm_scale=sm, validate=False))
        (fused, fused_timing), (unfused, unfused_timing) = fused_t, unfused_t
        path = context_path_for(qlen)
        engine = {"engine_path": path, "unfused_over_engine": unfused / (fused if path == "fused" else unfused)}
        for name, t, extra in (("cross, fp8 paged (fused, taught)", fused_t, engine),
                               ("cross, bf16 workspace (unfused)", unfused_t, {})):
            rows.append({"kind": "cross-context", "format": name, "batch": batch, "context": enc, "q_len": qlen,
                         "ms": t.ms, "TFLOPs": flops / t.ms / 1e9, "unfused_over_fused": unfused / fused,
                         "timing": t.how, **t.columns(), **extra})
    return rows


def run(batches=(1, 16, 64, 256), contexts=(512, 4096, 16384), log=print, engine: bool = False,
        peer: str | None = None, csv_path=None, kernels: bool = True, engine_args=()) -> list[dict]:
    """Measure everything; return one dict per row. `kernels=False`: only the engine's part (`engine_args`: the
    arguments of `minikv.bench engine`), its rows added to those already in `csv_path` (one recording in parts)."""
    import triton
    gpu = torch.cuda.get_device_name()
    log(f"{gpu}, torch {torch.__version__}, triton {triton.__version__}")
    if not kernels:
        return _engine_part(gpu, log, csv_path, engine_args)
    peer_decode = None
    if peer == "flashinfer":
        from minikv.bench.flashinfer_peer import FlashInferDecode
        peer_decode = FlashInferDecode()
        log(f"peer: FlashInfer {peer_decode.version} (BatchDecodeWithPagedKVCacheWrapper, NHD, the faster of its "
            "tensor-core and CUDA-core variants)")
    elif peer is not None:
        raise ValueError(f"unknown peer {peer!r}: the one peer is 'flashinfer'")
    ceil = ceilings()
    log(f"ceilings: device-to-device copy {ceil['copy_GBps']:.0f} GB/s, read-only sum {ceil['read_GBps']:.0f} GB/s")
    rows = []
    log(f"\n{'format':26s} {'batch':>5s} {'context':>7s} {'minikv us':>10s} {'spread':>7s} {'GB/s':>7s} {'% copy':>7s} "
        f"{'SDPA us':>8s} {'SDPA/minikv':>11s}" + (f" {'FI us':>8s} {'FI/minikv':>9s}" if peer_decode else ""))
    for batch in batches:
        for ctx in contexts:
            sdpa_t = sdpa_decode_ms(batch, ctx)
            sdpa, sdpa_timing = sdpa_t
            torch.cuda.empty_cache()
            for fmt in FORMATS:
                r = decode_case(fmt, batch, ctx, peer_decode)
                r.update(sdpa_ms=sdpa, sdpa_over_minikv=sdpa / r["ms"], pct_copy=100 * r["GBps"] / ceil["copy_GBps"],
                         sdpa_timing=sdpa_timing, **sdpa_t.columns("sdpa_"))
                rows.append(r)
                log(f"{fmt:26s} {batch:5d} {ctx:7d} {1e3 * r['ms']:10.1f} {_spread(r, ''):>7s} {r['GBps']:7.0f} "
                    f"{r['pct_copy']:6.0f}% {1e3 * sdpa:8.1f} {r['sdpa_over_minikv']:11.2f}"
                    + _peer_columns(r, peer_decode)
                    + ("" if r["timing"] == sdpa_timing == "cuda graph" else "  (eager)") + _noisy(r))
                torch.cuda.empty_cache()
    _save(rows, ceil, gpu, csv_path)
    log(f"\n{'context attention':34s} {'batch':>5s} {'q_len':>6s} {'kv_len':>6s} {'ms':>8s} {'TFLOP/s':>8s}")
    for r in prefill_cases() + cross_context_cases():
        rows.append(r)
        log(f"{r['format']:34s} {r['batch']:5d} {r['q_len']:6d} {r['context']:6d} {r['ms']:8.3f} {r['TFLOPs']:8.1f}")
    _save(rows, ceil, gpu, csv_path)
    if engine:
        from minikv.bench import engine as engine_bench
        log("\nengine decode (gemma-4-E2B-like, random weights, bf16, batch 64 and 1, per context; "
            "`minikv.bench engine --device cuda`)")
        args = engine_bench.gpu_args(engine_args)
        args.csv = args.csv or (csv_path and f"{csv_path}.engine-part")    # a time limit keeps the engine's rows
        engine_rows = engine_bench.measured_rows(args, log)
        # every column of the engine bench's rows (so that engine.targets works on the CSV), plus the common
        # ones: mode "replayed" (CUDA graphs), "eager" or "sdpa-graph" (the same model's step with torch SDPA over
        # a contiguous cache, format "auto"); ms per decode step; tokens_per_s decode tokens per second
        rows += [{"kind": "engine-decode", **r, "ms": r["decode_ms_per_step"], "tokens_per_s": r["decode_tokens_per_s"],
                  "timing": r.get("timing", "wall clock")} for r in engine_rows]
    _save(rows, ceil, gpu, csv_path)
    log("\n" + noise_summary(rows))
    log("\ntargets (ratios within this run):")
    for line in format_targets(rows):
        log(line)
    if engine:
        log("\nthe engine (minikv.bench engine):")
        for line in engine_bench.summary(engine_rows):
            log(line)
    return rows


def _engine_part(gpu: str, log, csv_path, engine_args) -> list[dict]:
    """The engine's rows added to `csv_path`'s, which must come from this GPU; a row measured again (same kind,
    format, batch, context and mode) replaces the older one."""
    from minikv.bench import engine as engine_bench
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    if rows and rows[0]["gpu"] != gpu:
        raise SystemExit(f"{csv_path} was measured on {rows[0]['gpu']}, this is {gpu}: one recording, one GPU")
    args = engine_bench.gpu_args(engine_args)
    args.csv = args.csv or f"{csv_path}.engine-part"        # the engine's rows as they come: a time limit keeps them
    new = [{"kind": "engine-decode", **r, "ms": r["decode_ms_per_step"], "tokens_per_s": r["decode_tokens_per_s"],
            "timing": r.get("timing", "wall clock"), "gpu": gpu} for r in engine_bench.measured_rows(args, log)]

    def key(r):
        return r["kind"], r["format"], str(r["batch"]), str(r["context"]), r.get("mode"), r.get("engine")
    fresh = {key(r) for r in new}
    rows = [r for r in rows if key(r) not in fresh] + new
    write_csv(rows, csv_path)
    log("\ntargets (ratios within one run; the engine's within this part):")
    for line in format_targets(rows) + engine_bench.summary(new):
        log(line)
    return rows


def _save(rows: list[dict], ceil: dict, gpu: str, csv_path) -> None:
    """The run's columns on every row (ceilings, GPU, versions); the rows written to `csv_path` if given."""
    import triton
    for r in rows:
        r.update(copy_GBps=ceil["copy_GBps"], read_GBps=ceil["read_GBps"], gpu=gpu, torch=torch.__version__,
                 triton=triton.__version__)
    if csv_path:
        write_csv(rows, csv_path)


def _spread(row: dict, prefix: str) -> str:
    """The spread of a row's timing (max / min of its repeats - 1), as a percentage."""
    lo, hi = row.get(f"{prefix}min_ms"), row.get(f"{prefix}max_ms")
    return f"{100 * (float(hi) / float(lo) - 1):.0f}%" if lo and hi else "-"


def _noisy(row: dict) -> str:
    """"  noisy: ..." naming the timings of the row whose spread stayed above timing.NOISY after re-measuring."""
    names = [name for name, prefix in (("minikv", ""), ("SDPA", "sdpa_"), ("FlashInfer", "flashinfer_"))
             if str(row.get(f"{prefix}noisy")) == "True"]
    return f"  noisy: {', '.join(names)} (re-measured {REMEASURES}x)" if names else ""


def noise_summary(rows: list[dict]) -> str:
    """How many of the run's timings were re-measured, and which stayed noisy."""
    taken = again = 0
    noisy = []
    for r in rows:
        for prefix in ("", "sdpa_", "flashinfer_"):
            if f"{prefix}remeasured" in r:
                taken += 1
                again += int(r[f"{prefix}remeasured"]) > 0
                if str(r[f"{prefix}noisy"]) == "True":
                    noisy.append(f"{prefix or 'minikv_'}{r['format']}@{r['batch']}x{r['context']}")
    return (f"spread: {again} of {taken} timings re-measured (spread over {100 * NOISY:.0f}%); "
            f"{len(noisy)} still noisy" + (f": {', '.join(noisy)}" if noisy else ""))


def _peer_columns(row: dict, peer) -> str:
    if peer is None:
        return ""
    if "flashinfer_ms" not in row:
        return f" {'-':>8s} {'-':>9s}"
    return f" {1e3 * row['flashinfer_ms']:8.1f} {row['flashinfer_over_minikv']:9.2f}"


def default_placement() -> str:
    """The engine's default kv_scale_placement (the placement the per-token-head targets are set for)."""
    from minikv.config import CacheConfig
    return CacheConfig().kv_scale_placement


# The per-token-head formats' goals over bf16 in each scale placement: (at batch 64 / context 4096, at every
# batch >= 16 and context >= 4096). The row layout's bytes limit is (128 + 4) / 256 -> 1.94x.
PTH_GOALS = {"row": (1.3, 1.2), "block": (1.6, None)}
# minikv's decode over FlashInfer's (its time / minikv's) at every measured shape with batch >= 16, per format.
PEER_GOALS = {"auto": 1.0, "fp8": 1.1}


def targets(rows: list[dict]) -> list[tuple[str, float, float]]:
    """(what, measured ratio, target) for every kernel target, each ratio taken within the one run `rows`."""
    decode = [r for r in rows if r["kind"] == "decode"]
    ms = {(r["format"], int(r["batch"]), int(r["context"])): float(r["ms"]) for r in decode}
    out = []

    def speedup(fmt, b, c):
        return ms[("auto", b, c)] / ms[(fmt, b, c)]

    default = default_placement()
    pth = []
    for placement in ("row", "block"):
        for name in ("int8_per_token_head", "fp8_per_token_head"):
            fmt = name if placement == "row" else name + "/block"
            pth.append((fmt, placement, "" if placement == default else " (other placement)"))
    big = sorted((b, c) for (f, b, c) in ms if f == "auto" and b >= 16 and c >= 4096)
    for fmt, placement, note in pth:
        goal, worst_goal = PTH_GOALS[placement]
        if (fmt, 64, 4096) in ms:
            out.append((f"{fmt} vs bf16 paged decode, batch 64, context 4096{note}", speedup(fmt, 64, 4096), goal))
        if worst_goal and big and all((fmt, b, c) in ms for b, c in big):
            b, c = min(big, key=lambda bc: speedup(fmt, *bc))
            out.append((f"{fmt} vs bf16 paged decode, worst with batch >= 16 and context >= 4096 (batch {b}, "
                        f"context {c}){note}", speedup(fmt, b, c), worst_goal))
    if ("fp8", 64, 4096) in ms:
        out.append(("fp8 vs bf16 paged decode, batch 64, context 4096", speedup("fp8", 64, 4096), 1.6))
    auto = [r for r in decode if r["format"] == "auto"]
    chosen = [r for r in auto if int(r["batch"]) >= 16]
    if chosen:
        w = min(chosen, key=lambda r: float(r["sdpa_over_minikv"]))
        out.append((f"bf16 paged decode vs SDPA, worst with batch >= 16 (batch {int(w['batch'])}, context "
                    f"{int(w['context'])})", float(w["sdpa_over_minikv"]), 0.95))
    cross: dict[tuple[int, int, int], dict[str, dict]] = {}
    for r in rows:
        if r["kind"] == "cross-context":
            path = "unfused" if "unfused" in r["format"] else "fused"
            cross.setdefault((int(r["batch"]), int(r["q_len"]), int(r["context"])), {})[path] = r
    for (b, q, e), paths in cross.items():
        engine = paths.get("fused", {}).get("engine_path")
        if engine:
            what = f"engine's cross context step (dispatched: {engine}) vs unfused, batch {b}, q_len {q}, encoder {e}"
            out.append((what, float(paths["unfused"]["ms"]) / float(paths[engine]["ms"]), 1.0))
        elif "fused" in paths:      # a run from before the engine dispatched by shape: the fused kernel itself
            out.append((f"fused fp8 cross context step vs unfused, batch {b}, q_len {q}, encoder {e}",
                        float(paths["fused"]["unfused_over_fused"]), 1.0))
    for fmt, goal in PEER_GOALS.items():
        peer = [r for r in decode if r["format"] == fmt and int(r["batch"]) >= 16 and r.get("flashinfer_ms")]
        if peer:
            w = min(peer, key=lambda r: float(r["flashinfer_over_minikv"]))
            out.append((f"{'bf16' if fmt == 'auto' else fmt} paged decode vs FlashInfer's, worst with batch >= 16 "
                        f"(batch {int(w['batch'])}, context {int(w['context'])}; FlashInfer {w['flashinfer_variant']})",
                        float(w["flashinfer_over_minikv"]), goal))
    prefill = {r["format"]: float(r["TFLOPs"]) for r in rows if r["kind"] == "prefill"}
    sdpa = prefill.get("self causal, torch SDPA")
    if sdpa and "self causal, paged bf16 (fused)" in prefill:
        out.append(("causal context attention TFLOP/s vs SDPA, paged bf16 (fused), batch 8, length 4096",
                    prefill["self causal, paged bf16 (fused)"] / sdpa, 0.9))
    return out


def format_targets(rows: list[dict]) -> list[str]:
    """One line per target: met/MISSED (the unrounded ratio against the target), the ratio rounded down to three
    decimals (`format_ratio`), the target."""
    lines = []
    for what, value, goal in targets(rows):
        met = value >= goal
        lines.append(f"{'met   ' if met else 'MISSED'} {format_ratio(value):>7s} (target {goal:.2f}x)  {what}")
    return lines


def write_csv(rows: list[dict], path) -> None:
    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minikv.bench attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", default=None, help="write every row to this CSV file")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 16384])
    p.add_argument("--peer", choices=["flashinfer"], default=None,
                   help="also time this library's paged decode on the same pools (an optional dependency)")
    p.add_argument("--engine", action="store_true",
                   help="also run `minikv.bench engine --device cuda` and put its rows in the same CSV")
    p.add_argument("--engine-args", default="", metavar="ARGS",
                   help="the engine part's arguments of `minikv.bench engine`, quoted (e.g. \"--capacity --peer "
                        "transformers\")")
    p.add_argument("--engine-only", action="store_true",
                   help="only the engine part, its rows added to --csv's (a recording made in several calls)")
    args = p.parse_args(argv)
    if args.engine_only and not (args.csv and os.path.exists(args.csv)):
        p.error("--engine-only adds rows to an existing --csv: run the kernels' part first")
    if not torch.cuda.is_available():
        print("minikv bench attention needs a CUDA GPU; nothing to measure here.")
        return 0
    if args.peer:
        from minikv.bench.flashinfer_peer import FlashInferUnavailable, load
        try:
            load()
        except FlashInferUnavailable as e:
            print(f"minikv bench attention: {e}", file=sys.stderr)
            return 2
    run(args.batches, args.contexts, log=lambda line: print(line, flush=True), peer=args.peer,
        engine=args.engine or args.engine_only, csv_path=args.csv, kernels=not args.engine_only,
        engine_args=shlex.split(args.engine_args))
    if args.csv:
        print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

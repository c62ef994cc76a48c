"""Would a block-local V transpose make the head-512 1-byte decode kernel reach the copy rate? (CUDA machine)

    python tools/gpu_probes/vt_decode_probe.py OUT_DIR            # the probe kernel below
    python tools/gpu_probes/vt_decode_probe.py OUT_DIR kernels    # minikv's own decode kernel, the tree on the path

The 1-byte decode kernels at gemma-4-E2B's full layer (8 query heads over 1 KV head of 512) run at about 70% of the
copy rate while bf16 streams at about 92% (results/gpu/decode-instructions-2026-12-07-h100). Their compiled loop
converts V to float16 in token order, stores that copy to shared memory and reads it back transposed: the P @ V dot
contracts over tokens, while a cache row holds one token's bytes. This probe asks what a layout that stores each
block's V codes transposed ([head_size, block_size] per block and kv head) would buy, before any cache format
changes. A small kernel of its own, one or two 16-token blocks per iteration, each block's rows from one table read:
  - "natural": V as the cache holds it today (the same small kernel, so the layout is the only difference);
  - "vt": V read from a copy of the pool whose V halves were transposed block by block.
Formats: fp8 (per tensor) and fp8_per_token_head in the "block" placement (its per-block scales read as the engine's
kernel reads them). Every candidate is first checked against minikv's torch reference on the untransposed pool
(varied scales).
Beside them: minikv's own kernel at its default configuration. Timings: CUDA-graph replay, L2 flushed
(minikv.bench.attention.cuda_time_ms); each includes minikv's split merge kernel. Writes vt_decode.csv.
"""
import csv
import itertools
import os
import sys

import torch
import triton
import triton.language as tl

BATCH, CTX, HQ, HKV, D, BS = 64, 8192, 8, 1, 512, 16
FORMATS = ("fp8", "fp8_per_token_head/block")
GRID = list(itertools.product((1, 2), (4, 8), (2, 3, 4)))       # (blocks per iteration, warps, stages)
SPLITS = (4, 8)
if os.environ.get("VT_GRID"):       # "blocks x warps x stages", comma separated; VT_SPLITS: "4,8"
    GRID = [tuple(int(v) for v in item.split("x")) for item in os.environ["VT_GRID"].split(",")]
    SPLITS = tuple(int(v) for v in os.environ.get("VT_SPLITS", "4,8").split(","))


@triton.jit
def _probe_kernel(q_ptr, pool_ptr, table_ptr, part_acc, part_ml, chunk, stride_tb, block_stride, kv_stride,
                  scale_offset, qk_scale, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                  BS: tl.constexpr, NB: tl.constexpr, VT: tl.constexpr, SCALES: tl.constexpr):
    """One (sequence, split): its `chunk` tokens (a multiple of NB * BS, no masks) for the GROUP heads of KV head 0."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    i = tl.arange(0, NB)
    j = tl.arange(0, BS)
    heads = g < GROUP
    q = tl.load(q_ptr + (b * GROUP + g)[:, None] * D + d[None, :], mask=heads[:, None], other=0.0).to(tl.float16)
    table = table_ptr + b.to(tl.int64) * stride_tb
    scales = pool_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for t0 in range(split * chunk, split * chunk + chunk, NB * BS):
        base = tl.load(table + t0 // BS + i).to(tl.int64) * block_stride               # [NB] block starts
        k = tl.load(pool_ptr + base[:, None, None] + j[None, :, None] * D + d[None, None, :])
        k = tl.reshape(k, [NB * BS, D]).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if SCALES:
            s = s * tl.reshape(tl.load(scales + (base[:, None] + scale_offset) // 4 + j[None, :]), [NB * BS])[None, :]
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if SCALES:
            p = p * tl.reshape(tl.load(scales + (base[:, None] + kv_stride + scale_offset) // 4 + j[None, :]),
                               [NB * BS])[None, :]
        v_base = pool_ptr + kv_stride + base
        if VT:      # [NB, D, BS] as stored: tokens contiguous, the order the dot contracts over
            v = tl.load(v_base[:, None, None] + d[None, :, None] * BS + j[None, None, :])
            v = tl.reshape(tl.permute(v, (1, 0, 2)), [D, NB * BS]).to(tl.float8e4nv, bitcast=True)
            v = tl.trans(v.to(tl.float16))
        else:       # [NB, BS, D] as the cache holds it today
            v = tl.load(v_base[:, None, None] + j[None, :, None] * D + d[None, None, :])
            v = tl.reshape(v, [NB * BS, D]).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        m = m_new
    part = (b * GROUP + g).to(tl.int64) * tl.num_programs(1) + split        # [B, Hq, P, D] as minikv merges them
    tl.store(part_acc + part[:, None] * D + d[None, :], acc, mask=heads[:, None])
    tl.store(part_ml + part * 2, m, mask=heads)
    tl.store(part_ml + part * 2 + 1, l, mask=heads)


def transposed_v(pool, layout):
    """A copy of the pool with every block's V codes stored [D, BS] (one KV head: a half's codes are contiguous)."""
    out = pool.clone()
    v = out[:, layout.spec.kv_bytes:layout.spec.kv_bytes + BS * D].view(-1, BS, D)
    v.copy_(v.transpose(1, 2).contiguous().view(-1, BS, D))
    return out


def probe_attention(q, pool, tables, layout, sm_scale, nb, vt, warps, stages, splits):
    from minikv.kernels.decode_attention import MERGE_CHUNK, _merge_splits_kernel
    batch, hq, d = q.shape
    spec = layout.spec
    chunk = tables.shape[1] * BS // splits       # every sequence fills its table
    acc = torch.empty(batch, hq, splits, d, dtype=torch.float32, device=q.device)
    ml = torch.empty(batch, hq, splits, 2, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    scales = layout.has_inline_scales
    _probe_kernel[(batch, splits)](q, pool, tables, acc, ml, chunk, tables.stride(0), spec.block_bytes,
                                   spec.kv_bytes, max(spec.scale_offset, 0), sm_scale * 1.4426950408889634,
                                   GROUP=hq, BLOCK_G=max(16, hq), D=d, BS=BS, NB=nb, VT=vt, SCALES=scales,
                                   num_warps=warps, num_stages=stages)
    _merge_splits_kernel[(batch, hq)](acc, ml, out, out.stride(0), out.stride(1), splits, HEAD_SIZE=d,
                                      CHUNK=MERGE_CHUNK)
    return out


def check(job):
    """Compile one candidate on a small problem (3 sequences of 1,024 tokens) and return its max |difference| from
    minikv's torch reference on the untransposed pool, over the reference's largest |value|, or the error."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import decode_occupancy
    from minikv.kernels.decode_attention import paged_decode_attention_reference
    fmt, nb, vt, warps, stages = job
    layout, pool, tables, lens, q = decode_occupancy.problem(fmt, {"heads": (HQ, HKV), "head_size": D}, 3, 1024)
    if layout.has_inline_scales:        # varied scales, so that a scale read from the wrong token shows
        for s in layout.scale_views(pool):
            s.copy_(torch.rand(s.shape, device=s.device, generator=torch.Generator(s.device).manual_seed(1)) + 0.5)
    ref = paged_decode_attention_reference(q, pool, tables, lens, layout, D ** -0.5)
    try:
        got = probe_attention(q, transposed_v(pool, layout) if vt else pool, tables, layout, D ** -0.5, nb, vt,
                              warps, stages, 4)
        return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def main(out_dir):
    import multiprocessing as mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import decode_occupancy
    from minikv.bench.attention import cuda_time_ms
    from minikv.kernels import paged_decode_attention
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, "vt_decode.csv"), "w", newline="")
    w = csv.DictWriter(f, ["format", "kernel", "blocks_per_iter", "warps", "stages", "splits", "us", "GBps",
                           "relative_diff", "error"])
    w.writeheader()
    jobs = [(fmt, nb, vt, warps, stages) for fmt in FORMATS for nb, warps, stages in GRID for vt in (False, True)]
    with mp.get_context("spawn").Pool(15) as workers:
        diffs = dict(zip(jobs, workers.map(check, jobs, chunksize=1)))
    print(f"compiled and checked {len(jobs)} candidates", flush=True)
    shape = {"heads": (HQ, HKV), "head_size": D}
    sm_scale = D ** -0.5
    for fmt in FORMATS:
        layout, pool, tables, lens, q = decode_occupancy.problem(fmt, shape, BATCH, CTX)
        pools = {False: pool, True: transposed_v(pool, layout)}
        read = BATCH * CTX * 2 * (D + (4 if layout.has_inline_scales else 0))
        minikv = 1e3 * cuda_time_ms(lambda: paged_decode_attention(q, pool, tables, lens, layout, sm_scale,
                                                                   validate=False)).ms
        w.writerow(dict(format=fmt, kernel="minikv default", us=minikv, GBps=read / minikv / 1e3))
        print(f"{fmt:26s} minikv default {minikv:8.1f} us {read / minikv / 1e3:7.0f} GB/s", flush=True)
        best = {}
        for (jf, nb, vt, warps, stages), diff in diffs.items():
            if jf != fmt:
                continue
            for splits in SPLITS:
                r = dict(format=fmt, kernel="vt" if vt else "natural", blocks_per_iter=nb, warps=warps,
                         stages=stages, splits=splits)
                if isinstance(diff, str) or diff > 0.01:
                    r["error"] = diff if isinstance(diff, str) else f"relative |diff| {diff}"
                else:
                    us = 1e3 * cuda_time_ms(lambda: probe_attention(q, pools[vt], tables, layout, sm_scale, nb, vt,
                                                                    warps, stages, splits)).ms
                    r.update(us=us, GBps=read / us / 1e3, relative_diff=diff)
                    if us < best.get(vt, (float("inf"),))[0]:
                        best[vt] = (us, nb, warps, stages, splits)
                w.writerow(r)
                f.flush()
        for vt, (us, nb, warps, stages, splits) in sorted(best.items()):
            print(f"{fmt:26s} {'vt' if vt else 'natural':14s} {us:8.1f} us {read / us / 1e3:7.0f} GB/s "
                  f"({minikv / us:.2f}x minikv's speed; {nb} block(s) per iteration, {warps} warps, {stages} "
                  f"stages, {splits} splits)", flush=True)
        pool = pools = None
        torch.cuda.empty_cache()
    f.close()


# `kernels` mode: minikv's paged_decode_attention at E2B's two layer shapes, batch 64, context 8192, its default
# configuration and (block_n, warps, stages, max_registers) beside it, each checked against the torch reference
KERNEL_FORMATS = ("auto", "fp8", "fp8_per_token_head", "int8_per_token_head/block", "fp8_per_token_head/block")
if os.environ.get("KAB_FORMATS"):
    KERNEL_FORMATS = tuple(os.environ["KAB_FORMATS"].split(","))
KERNEL_SHAPES = (((HQ, HKV), 512, 0, CTX), ((HQ, HKV), 256, 512, CTX), ((32, 8), 128, 0, 4096))   # the last: bench's
if os.environ.get("KAB_HEADS"):       # head sizes to keep, comma separated
    KERNEL_SHAPES = tuple(x for x in KERNEL_SHAPES if str(x[1]) in os.environ["KAB_HEADS"].split(","))
KERNEL_GRID_128 = [(64, 4, 5, None), (128, 4, 3, None), (128, 8, 5, None), (64, 4, 3, None)]
KERNEL_GRID = [(32, 4, 3, None), (32, 4, 5, None), (64, 4, 3, None), (32, 4, 3, 168), (32, 4, 4, 168),
               (32, 4, 5, 168), (64, 8, 3, None)]


def kernel_check(job):
    import dataclasses
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import decode_occupancy
    from minikv.kernels import paged_decode_attention
    from minikv.kernels.decode_attention import paged_decode_attention_reference
    fmt, heads, head_size, window, cfg = job
    layout, pool, tables, lens, q = decode_occupancy.problem(fmt, {"heads": heads, "head_size": head_size}, 3, 1024)
    if layout.has_inline_scales:
        for s in layout.scale_views(pool):
            s.copy_(torch.rand(s.shape, device=s.device, generator=torch.Generator(s.device).manual_seed(1)) + 0.5)
    lens = torch.tensor([1, 700, 1024], dtype=torch.int32, device="cuda")
    try:
        got = paged_decode_attention(q, pool, tables, lens, layout, head_size ** -0.5, sliding_window=window,
                                     config=None if cfg is None else dataclasses.replace(cfg, num_splits=3))
        ref = paged_decode_attention_reference(q, pool, tables, lens, layout, head_size ** -0.5,
                                               sliding_window=window)
        return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def kernels(out_dir, label):
    import dataclasses
    import multiprocessing as mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import decode_occupancy
    from minikv.bench.attention import cuda_time_ms
    from minikv.kernels import launch, paged_decode_attention
    os.makedirs(out_dir, exist_ok=True)
    jobs = []
    for heads, head_size, window, ctx in KERNEL_SHAPES:
        for fmt in KERNEL_FORMATS:
            layout = decode_occupancy.layout_of(fmt, {"heads": heads, "head_size": head_size})
            base = launch.decode_config(BATCH, heads[1], heads[0] // heads[1], head_size, layout.elem_bytes, ctx,
                                        torch.device("cuda"), fmt=layout.fmt, placement=layout.placement)
            jobs.append((fmt, heads, head_size, window, ctx, None, base))
            jobs += [(fmt, heads, head_size, window, ctx, dataclasses.replace(
                base, block_n=n, num_warps=w, num_stages=st, max_registers=r), None)
                for n, w, st, r in (KERNEL_GRID if head_size > 128 else KERNEL_GRID_128) if layout.elem_bytes == 1]
    with mp.get_context("spawn").Pool(15) as workers:
        diffs = workers.map(kernel_check, [(*j[:3], j[3], j[5]) for j in jobs], chunksize=1)
    path = os.path.join(out_dir, f"kernels_{label}.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["tree", "heads", "head_size", "window", "format", "config", "block_n", "warps", "stages",
                               "max_registers", "splits", "us", "relative_diff", "error"])
        w.writeheader()
        problem = None
        for (fmt, heads, head_size, window, ctx, cfg, base), diff in zip(jobs, diffs):
            if problem is None or problem[0] != (fmt, heads, head_size):
                problem = ((fmt, heads, head_size), decode_occupancy.problem(
                    fmt, {"heads": heads, "head_size": head_size}, BATCH, ctx))
            layout, pool, tables, lens, q = problem[1]
            c = cfg or base
            r = dict(tree=label, heads=f"{heads[0]}/{heads[1]}", head_size=head_size, window=window, format=fmt, config="default" if cfg is None
                     else "grid", block_n=c.block_n, warps=c.num_warps, stages=c.num_stages,
                     max_registers=c.max_registers, splits=c.num_splits)
            if isinstance(diff, str) or diff > 0.01:
                r["error"] = diff if isinstance(diff, str) else f"relative |diff| {diff}"
            else:
                r.update(relative_diff=diff, us=1e3 * cuda_time_ms(lambda: paged_decode_attention(
                    q, pool, tables, lens, layout, head_size ** -0.5, sliding_window=window, validate=False,
                    config=cfg)).ms)
            w.writerow(r)
            print(f"{label:6s} heads {heads[0]}/{heads[1]} head {head_size} window {window:3d} {fmt:26s} {r['config']:7s} block_n {c.block_n:2d} "
                  f"warps {c.num_warps} stages {c.num_stages} regs {c.max_registers or '-':>3} "
                  + (f"{r['us']:8.1f} us" if "us" in r else r["error"]), flush=True)


if __name__ == "__main__":
    if sys.argv[2:3] == ["kernels"]:
        kernels(sys.argv[1], os.environ.get("TREE", "tree"))
    else:
        main(sys.argv[1])

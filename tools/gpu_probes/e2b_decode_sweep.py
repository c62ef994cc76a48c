"""Decode launch configurations at the engine bench's attention shapes (gemma-4-E2B: 8 query heads over 1 KV head),
batch 64, context 8192, on a CUDA machine:

    python tools/gpu_probes/e2b_decode_sweep.py OUT_DIR              # every format, "row" placement
    python tools/gpu_probes/e2b_decode_sweep.py OUT_DIR one-byte     # the 1-byte formats at head 512, both placements
    python tools/gpu_probes/e2b_decode_sweep.py OUT_DIR row-window   # the "row" placement's aligned reads by class

The full layers (head size 512, no window) and the sliding ones (256, window 512), every format in the default
"row" placement: launch.decode_config's own choice ("default") and a grid of (block_n, warps, stages) at its
split count, half and twice it. Each candidate is checked against the torch reference on a small problem first.
Timings: CUDA-graph replay, L2 flushed (minikv.bench.attention.cuda_time_ms). Writes e2b_decode_sweep.csv.

`one-byte`: the full layers only, where the per-token-head formats ran slower than bf16 (results/gpu/decode-profile:
336 us against 264 at this shape on an H200), with a wider grid (64-token tiles, 1 and 2 stages, V converted where the
compiler places it) over fp8, and both per-token-head formats in both scale placements; bf16's default beside them.
Writes e2b_decode_one_byte.csv.

`row-window`: both layer shapes, the per-token-head formats in the "row" placement read in aligned pieces, one
program per class of token positions (decode_attention.row_window_period: 516- and 260-byte slots, period 4), over
a grid of tiles, warps, stages and 1x, 2x, 4x the default's programs; beside them the default with 4-byte loads
("4-byte loads"), bf16 and the "block" placement. Writes e2b_decode_row_window.csv.
"""
import csv
import dataclasses
import itertools
import os
import sys

import torch

import decode_occupancy  # noqa: E402  (this folder, first on sys.path when run as a script)

FORMATS = ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head")
SHAPES = ((512, 0), (256, 512))          # (head size, sliding window)
GRID = list(itertools.product((16, 32), (4, 8), (3, 4, 5)))
# one-byte mode: "format/placement" names, and (block_n, warps, stages, v_pure)
ONE_BYTE_FORMATS = ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head", "int8_per_token_head/block",
                    "fp8_per_token_head/block")
ONE_BYTE_GRID = list(itertools.product((16, 32, 64), (4, 8), (1, 2, 3, 4), (False, True)))
# row-window mode: (block_n, warps, stages, programs per (sequence, kv head) as a multiple of the default's)
WINDOW_FORMATS = ("auto", "int8_per_token_head", "fp8_per_token_head", "fp8_per_token_head/block")
WINDOW_GRID = list(itertools.product((16, 32, 64), (4, 8), (3, 5), (1, 2, 4)))
if os.environ.get("WINDOW_GRID"):       # a narrower grid: "block_n x warps x stages x programs", comma separated
    WINDOW_GRID = [tuple(int(v) for v in item.split("x")) for item in os.environ["WINDOW_GRID"].split(",")]
MODE = {"formats": FORMATS, "shapes": SHAPES, "one_byte": False, "row_window": False}


def set_mode(mode):
    """The sweep's formats and grid: None (every format, "row"), "one-byte" or "row-window"; also run in each
    worker."""
    if mode == "one-byte":
        MODE.update(formats=ONE_BYTE_FORMATS, shapes=((512, 0),), one_byte=True)
    elif mode == "row-window":
        MODE.update(formats=WINDOW_FORMATS, row_window=True)
    elif mode is not None:
        sys.exit(f"unknown mode {mode!r}: the modes are one-byte and row-window")


E2B = {"heads": (8, 1)}             # 8 query heads over 1 KV head; decode_occupancy.py builds the problem


def layout_of(name, head_size):
    return decode_occupancy.layout_of(name, {**E2B, "head_size": head_size})


def problem(fmt, head_size, batch, ctx):
    return decode_occupancy.problem(fmt, {**E2B, "head_size": head_size}, batch, ctx)


def candidates(fmt, head_size):
    from minikv.kernels import launch
    layout = layout_of(fmt, head_size)
    base = launch.decode_config(64, 1, 8, head_size, layout.elem_bytes, 8192, torch.device("cuda"), fmt=layout.fmt,
                                placement=layout.placement)
    # the rule before head sizes above 128 had their own entry (launch.DECODE_LARGE_HEAD)
    old_n = max(16, min(launch.DECODE_MAX_TOKENS, launch.DECODE_TILE_BYTES // (head_size * layout.elem_bytes)))
    old = dataclasses.replace(base, block_n=old_n, num_stages=launch.DECODE_STAGES[layout.elem_bytes],
                              num_splits=launch.decode_splits(64, 1, 8192, old_n, launch.num_sms(0)))
    cands = [("default", base), ("old rule", old)]
    if MODE["row_window"]:
        if layout.has_inline_scales and layout.scale_placement == "row":
            cands.append(("4-byte loads", dataclasses.replace(base, row_window=False)))
            for (block_n, warps, stages, programs) in WINDOW_GRID:
                cands.append(("grid", dataclasses.replace(base, block_n=block_n, num_warps=warps, num_stages=stages,
                                                          num_splits=base.num_splits * programs)))
        return base, cands
    if MODE["one_byte"]:
        if layout.elem_bytes == 1:
            for (block_n, warps, stages, v_pure) in ONE_BYTE_GRID:
                cands.append(("grid", dataclasses.replace(base, block_n=block_n, num_warps=warps, num_stages=stages,
                                                          v_pure=v_pure)))
        return base, cands
    for (block_n, warps, stages) in GRID:
        for splits in sorted({base.num_splits, min(64, 2 * base.num_splits)}):
            cands.append(("grid", dataclasses.replace(base, block_n=block_n, num_warps=warps, num_stages=stages,
                                                      num_splits=splits)))
    return base, cands


def check(job):
    """Compile one (format, shape, candidate) on a small problem (same specializations as the large one: the
    block table is 64 wide) and return its max |difference| from the torch reference."""
    import minikv.kernels  # noqa: F401
    from minikv.kernels import paged_decode_attention
    from minikv.kernels.decode_attention import paged_decode_attention_reference
    fmt, head_size, window, index = job
    cfg = candidates(fmt, head_size)[1][index][1]
    layout, pool, tables, lens, q = problem(fmt, head_size, 3, 1024)
    lens = torch.tensor([1, 700, 1024], dtype=torch.int32, device="cuda")
    try:
        got = paged_decode_attention(q, pool, tables, lens, layout, head_size ** -0.5, sliding_window=window,
                                     config=cfg)
        ref = paged_decode_attention_reference(q, pool, tables, lens, layout, head_size ** -0.5,
                                               sliding_window=window)
        return (got.float() - ref.float()).abs().max().item()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def main(out_dir, mode=None):
    import multiprocessing as mp
    import time
    from minikv.bench.attention import cuda_time_ms
    from minikv.kernels import paged_decode_attention
    set_mode(mode)
    formats, shapes = MODE["formats"], MODE["shapes"]
    os.makedirs(out_dir, exist_ok=True)
    name = ("e2b_decode_one_byte.csv" if MODE["one_byte"] else "e2b_decode_row_window.csv" if MODE["row_window"]
            else "e2b_decode_sweep.csv")
    f = open(os.path.join(out_dir, name), "w", newline="")
    w = csv.DictWriter(f, ["head_size", "window", "format", "config", "block_n", "warps", "stages", "v_pure",
                           "row_window", "splits", "us", "max_abs_diff", "error"])
    w.writeheader()
    jobs = [(fmt, hs, win, i) for hs, win in shapes for fmt in formats for i in range(len(candidates(fmt, hs)[1]))]
    start = time.time()
    with mp.get_context("spawn").Pool(15, initializer=set_mode, initargs=(mode,)) as workers:
        diffs = dict(zip(jobs, workers.map(check, jobs, chunksize=1)))
    print(f"compiled and checked {len(jobs)} candidates in {time.time() - start:.0f} s", flush=True)
    for head_size, window in shapes:
        for fmt in formats:
            layout, pool, tables, lens, q = problem(fmt, head_size, 64, 8192)
            base, cands = candidates(fmt, head_size)
            best, rows_done = None, []
            for name, cfg in cands:
                r = dict(head_size=head_size, window=window, format=fmt, config=name, block_n=cfg.block_n,
                         warps=cfg.num_warps, stages=cfg.num_stages, v_pure=cfg.v_pure, row_window=cfg.row_window,
                         splits=cfg.num_splits)
                diff = diffs[(fmt, head_size, window, len(rows_done))]
                rows_done.append(name)
                try:
                    if isinstance(diff, str):
                        raise RuntimeError(diff)
                    r["max_abs_diff"] = diff
                    r["us"] = 1e3 * cuda_time_ms(lambda: paged_decode_attention(
                        q, pool, tables, lens, layout, head_size ** -0.5, sliding_window=window, validate=False,
                        config=cfg)).ms
                    if best is None or r["us"] < best[0]:
                        best = (r["us"], name, cfg)
                    if name == "default":
                        default_us = r["us"]
                    if name == "old rule":
                        old_us = r["us"]
                    if name == "4-byte loads":
                        print(f"    {fmt}: 4-byte loads {r['us']:8.1f} us", flush=True)
                except Exception as exc:  # noqa: BLE001
                    r["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                w.writerow(r)
                f.flush()
            print(f"head {head_size} window {window} {fmt:20s}: default {default_us:8.1f} us "
                  f"(block_n {base.block_n}, warps {base.num_warps}, stages {base.num_stages}, splits "
                  f"{base.num_splits}); best {best[0]:8.1f} us = {default_us / best[0]:.2f}x faster (block_n "
                  f"{best[2].block_n}, warps {best[2].num_warps}, stages {best[2].num_stages}, splits "
                  f"{best[2].num_splits}, v_pure {best[2].v_pure}); old rule {old_us:8.1f} us "
                  f"({old_us / default_us:.2f}x the default's time)", flush=True)
            if fmt == "auto":
                bf16_us = default_us
            else:
                print(f"    bf16's time over this format's: default {bf16_us / default_us:.2f}x, "
                      f"best {bf16_us / best[0]:.2f}x", flush=True)
            del pool
            torch.cuda.empty_cache()
    f.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])

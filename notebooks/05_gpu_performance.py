# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Performance on a GPU
#
# The notebooks so far ran the Triton kernels in the interpreter, where speed means nothing. Here the same kernels
# are compiled for a GPU (an NVIDIA H100 in the recording below) and measured against two things that do mean
# something:
#
# * **the hardware**: a paged decode step is a memory-bound read of the KV cache, so its ceiling is the memory
#   bandwidth. We measure two ceilings in the same run: a device-to-device copy (bytes read + written per second)
#   and a read-only pass (a sum over a few GiB);
# * **the best unpaged kernel torch has**: `scaled_dot_product_attention` over a contiguous bf16 cache of the same
#   shape. Paging adds an indirection through the block table; quantization removes bytes;
# * **a production library's paged decode**: FlashInfer's, run on minikv's own pools, block tables and queries,
#   for the two formats it shares with minikv (bf16 and fp8 per tensor).
#
# Last, the whole engine: tokens/s per cache format against the context length, with its decode step replayed
# from CUDA graphs and launched eagerly; then beside transformers' own engine, and at a fixed memory budget.
#
# **How this notebook is tested.** Every figure and table is drawn from one CSV, `notebooks/data/gpu_attention.csv`
# (committed), written by the benchmark on H100s of one kind and one tree, in parts: one run of the kernels,
# FlashInfer and the engine at 2,048 and 8,192 tokens (`bash tools/gpu.sh bench`, which runs `python -m
# minikv.bench attention --engine --peer flashinfer`; `../results/gpu/bench-2026-12-07-h100/`), then, in later
# device calls, transformers' rows, the 32,768-token prompts and the memory budget, each added to that CSV with
# `--engine-only` (`../results/gpu/bench-2026-12-07-h100-parts/`). Every ratio is taken between rows of one part,
# and a few sections read the probes they name.
# The one cell marked `NBVAL_SKIP` measures again, and only on a GPU when asked to; every other cell reads the
# CSVs and is re-executed and compared everywhere, on a laptop without a GPU too.

# %% [markdown]
# **Where this fits.** The formats measured here are introduced in [02](02_quantized_kv_cache.ipynb) and
# [docs/concepts/kv-cache-formats.md](../docs/concepts/kv-cache-formats.md); the measured tables are also in
# [docs/results.md](../docs/results.md), and *roofline*, *SDPA* and *scale placement* are in the
# [glossary](../docs/glossary.md).

# %%
import csv
from pathlib import Path


DATA = next(p for p in (Path("data/gpu_attention.csv"), Path("notebooks/data/gpu_attention.csv"))
            if p.parent.exists())

# %% [markdown]
# ## The measurement (GPU only)
#
# Paged decode: 32 query heads, 8 KV heads (GQA 4:1), head size 128, block size 16, blocks in shuffled order, at
# batch 1/16/64/256 and context 512/4096/16384, for the four cache formats, the two per-token-head ones in both
# scale placements (explained below; `…/block` in the figures, dotted). Every time is the median of 20 runs
# timed with CUDA events, the L2 cache flushed before each, and each run is a replay of a CUDA graph holding the
# call, as a real engine captures its decode step: that takes Python's launch overhead (for a Triton launch, more
# than a small decode step's whole GPU time) out of both minikv's and SDPA's figures. Then causal
# prefill (batch 8, length 4096) and the
# cross-attention context step, fused (reading the fp8 paged cache, taught its format) against unfused (reading
# the bf16 workspace). Last, the engine itself: decode tokens/s per format of a model at gemma-4-E2B's dimensions
# with random weights, at batch 64 (`minikv/bench/engine.py`). The code is `minikv/bench/attention.py`;
# `python -m minikv.bench attention --csv out.csv` runs the kernels' part from a shell,
# `python -m minikv.bench engine --device cuda` the engine's, and `bash tools/gpu.sh bench` both in one run, with
# FlashInfer beside minikv where it is installed (`tools/pack_flashinfer.sh` packs it for a machine without the
# internet).

# %%
# NBVAL_SKIP
# Measure again (a GPU machine; about six minutes on an H100): set MEASURE = True. The CSV is overwritten part by
# part as the run goes; every cell below then draws the new run.
import importlib.util

MEASURE = False
if MEASURE:
    from minikv.bench import attention
    attention.run(log=print, engine=True, csv_path=DATA,
                  peer="flashinfer" if importlib.util.find_spec("flashinfer") else None)

# %% [markdown]
# What the CSV holds, and where it was measured:

# %%
with open(DATA) as _f:
    _recorded = list(csv.DictReader(_f))
_kinds = {k: sum(r["kind"] == k for r in _recorded) for k in dict.fromkeys(r["kind"] for r in _recorded)}
print(f"{len(_recorded)} rows: " + ", ".join(f"{n} {k}" for k, n in _kinds.items()))
print(f"measured on {_recorded[0]['gpu']}, torch {_recorded[0]['torch']}, triton {_recorded[0]['triton']}, "
      f"FlashInfer {next((r['flashinfer'] for r in _recorded if r.get('flashinfer')), 'not installed')}")

# %% [markdown]
# ## How the kernels are launched
#
# Decode is a read of the whole cache, so the question is how many bytes are in flight at once and how little work
# each byte costs on the way. One Triton kernel serves every format (`kernels/decode_attention.py`):
#
# * each tile of K and V codes is loaded in its natural order, `[tokens, head_size]`, straight into the two dot
#   products (one for QK, one for PV). Loads that feed `tl.dot` are what Triton's software pipeliner stages: with
#   enough pipeline stages they become asynchronous copies into a ring of shared-memory buffers, two tiles ahead
#   for the 1-byte formats, and registers hold only the tile being computed;
# * the dot products of the 1-byte formats run in float16: an e4m3 code converts to float16 exactly with the
#   hardware's packed conversion (two codes per instruction), an int8 code with a bit trick in inline PTX (four
#   codes per 32-bit word placed in the mantissas of 1024.0, then one packed subtraction); q is rescaled per row
#   by a power of two so that it fits float16's range (an exact operation);
# * one program per (sequence, KV head) is too few at small batches, so each sequence's tokens are split over
#   several programs (split-K), as many as fill every SM once (`kernels/launch.py` computes it from the SM
#   count), and a second kernel merges the partial results. (An earlier version could let the last program of a
#   sequence to finish do the merge, with an atomic counter per sequence and KV head, saving the second launch;
#   measured, that was slower, since the merge then waits on one program per sequence, and it was removed.)
#
# The tiles, the pipeline depth and the merge are the fastest of two probes of candidate configurations on the
# H200 (raw timings in `data/gpu_decode_probe.csv` and `data/gpu_decode_probe_defaults.csv`, the runs' logs in
# `results/gpu/pipelined-decode-probe/` and `decode-defaults-probe/`: every candidate checked against the torch
# reference and timed). One kernel serves both placements of the per-token-head scales (next section): for vLLM's
# row placement, whose rows are only 4-byte aligned, it reads each row as two aligned 16-byte pieces
# (`row-window` in the CSV's kernel column). The CSV says which kernel and configuration served every case:

# %%
import csv as _csv  # noqa: E402 (the cell above is GPU-only)

with open(DATA) as _f:
    _launch = [r for r in _csv.DictReader(_f) if r["kind"] == "decode" and r["batch"] == "64" and r["context"] == "4096"]
print(f"{'format':27s} {'kernel':10s} {'tokens/tile':>11s} {'stages':>6s} {'splits':>6s}   (batch 64, context 4096)")
for r in _launch:
    print(f"{r['format']:27s} {r['kernel']:10s} {r['block_n']:>11s} {r['stages']:>6s} {r['splits']:>6s}")

# %% [markdown]
# ## The alignment issue, and its fix: two placements of the per-token-head scales
#
# A GPU thread reads at most 16 bytes with one load instruction, and only from an address that is a multiple of
# 16; a compiler that cannot prove a row starts on such an address has to read it in narrower pieces. So the same
# bytes can cost four times as many load instructions, depending only on where each row starts.
#
# An int8 or fp8 per-token-head cache stores each row (one token, one KV head) as 128 one-byte codes plus one fp32
# scale. *Where* the scale goes is a layout choice (`KVLayout(..., scale_placement=...)`, engine option
# `LLM(..., kv_scale_placement=...)`); at this notebook's shape both placements hold the same bytes per block:
#
# * **`"row"`** (vLLM's layout, the one notebooks 02 and 03 draw and defect A's reproduction shows): each scale sits
#   right after its row's codes, `[128 codes | scale]`, so a row is 132 bytes. 132 is a multiple of 4 but not of 16,
#   so the kernel can only load a row 4 bytes at a time, and every row's scale is a separate 4-byte load at a
#   132-byte stride: scattered scale reads between the codes.
# * **`"block"`**: each half (K or V) of a block keeps all its rows' codes together, 128-byte rows, then all the
#   half's scales, one contiguous fp32 vector per KV head. Every row is 16-byte aligned (wide loads, exactly like
#   fp8 per tensor, which has no scales), and a tile's scales arrive in one contiguous load.
#
# The engine's default stays `"row"`: it is vLLM's layout, the one the defect notebooks reproduce and explain
# byte by byte. The scale wipe reproduces with `"block"` too (its scale regions still live in the shared block
# storage; `tests/test_scale_placement.py`), and it generates the same tokens, so the faster layout is one argument
# away. The benchmark above measured every per-token-head format in both placements (names ending in `/block`).

# %%
import torch

from minikv.cache.layout import KVLayout

for placement in ("row", "block"):
    lay = KVLayout("int8_per_token_head", torch.bfloat16, num_kv_heads=8, head_size=128, block_size=16,
                   scale_placement=placement)
    starts = [(row * lay.row_bytes) % 16 for row in range(4)]
    print(f"{placement:5s}: row {lay.row_bytes} bytes, first four rows start at offsets = {starts} (mod 16), "
          f"next slot's scale {lay.scale_slot_bytes} bytes further, block {lay.block_bytes} bytes")


# %% [markdown]
# ## Results (from the recorded CSV)
#
# Everything from here on reads the committed CSV and prints it once; the figures are `minikv.viz.gpu`'s. Colours
# name a format in every figure (bf16 blue, fp8 per tensor orange, int8 per-token-head green, fp8 per-token-head
# purple) and each format has its own marker; the block placement of a per-token-head format has its colour with a
# dotted line, a hollow marker or a hatched bar. No colour here means "wrong": every kernel measured computes the
# right answer (tests/test_kernels_gpu.py).

# %%
from minikv.viz import gpu as viz_gpu
from minikv.bench.attention import format_targets

TEXT_COLUMNS = ("kind", "format", "gpu", "torch", "triton", "timing", "sdpa_timing", "kernel", "mode",
                "flashinfer", "flashinfer_variant", "flashinfer_timing", "engine_path")


def _value(key, text):
    """A CSV cell: a number where it reads as one (text columns stay text)."""
    try:
        return text if key in TEXT_COLUMNS or text == "" else float(text)
    except ValueError:                  # e.g. noisy ("True"), steps_ms (one time per step)
        return text


def load(path):
    with open(path) as f:
        return [{k: _value(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


rows = load(DATA)
first = rows[0]
print(f"GPU: {first['gpu']}, torch {first['torch']}, triton {first['triton']}")
print(f"ceilings: copy {first['copy_GBps']:.0f} GB/s, read-only {first['read_GBps']:.0f} GB/s")
decode = [r for r in rows if r["kind"] == "decode"]
batches = sorted({int(r["batch"]) for r in decode})
contexts = sorted({int(r["context"]) for r in decode})
formats = list(dict.fromkeys(r["format"] for r in decode))
shapes = [(b, c) for b in batches for c in contexts]
ms = {(r["format"], int(r["batch"]), int(r["context"])): 1e3 * r["ms"] for r in decode}          # µs
nbytes = {(r["format"], int(r["batch"]), int(r["context"])): r["bytes"] for r in decode}
over_sdpa = {(r["format"], int(r["batch"]), int(r["context"])): r["sdpa_over_minikv"] for r in decode}


short = {"auto": "bf16", "fp8": "fp8", "int8_per_token_head": "int8 row", "int8_per_token_head/block": "int8 block",
         "fp8_per_token_head": "fp8 pth row", "fp8_per_token_head/block": "fp8 pth block"}


def over_bf16(fmt, b, c):
    """How much faster than bf16 paged decode `fmt` is at (batch b, context c): above 1 is faster."""
    return ms[("auto", b, c)] / ms[(fmt, b, c)]

# %%
viz_gpu.bandwidth_figure(rows)

# %% [markdown]
# ## Time against the memory roofline
#
# A decode step has to move its bytes (cache rows with their scales, queries, block tables, outputs), so it cannot
# take less than bytes ÷ bandwidth: the line below, at the device-copy bandwidth measured in the same run (a kernel
# that mostly reads can beat a copy by a few percent, as bf16 does at the largest steps). Every point is one
# format at one shape. A point on the line runs at the memory's speed; its height above the line is what the kernel
# loses. A 1-byte format moves about half of bf16's bytes, so its points sit about a factor 2 further left, and
# would be about 2x faster if they reached the line too. At the smallest steps every format pays a fixed cost
# (launches, the split-K merge) that has nothing to do with bytes: the points flatten out on the left.

# %%
viz_gpu.roofline_figure(rows)

# %% [markdown]
# The same at three large steps, one bar per format (hatched: block placement), the roofline time of its bytes as
# a black mark. The row and block placements of a per-token-head format move the same bytes, so they share a mark
# and differ only in their bars.

# %%
viz_gpu.roofline_bars_figure(rows, [(64, 4096), (16, 16384), (256, 16384)])

# %% [markdown]
# ## Against the best unpaged bf16 kernel
#
# The honest comparison for a quantized cache is not bf16 *paged* decode but the fastest bf16 attention torch has:
# SDPA over a contiguous (unpaged) bf16 cache of the same shape, measured in the same run. Above 1 means minikv's
# kernel on that format is faster than SDPA on bf16.

# %%
viz_gpu.sdpa_ratio_figure(rows)

# %% [markdown]
# Read from the same CSV: at how many of the shapes each format is faster than SDPA on bf16, and its two ratios at
# batch 64 / context 4096.

# %%
print(f"{'format':27s} {'faster than SDPA':>17s}   at batch 64, context 4096: x SDPA  x bf16 paged")
for fmt in formats:
    wins = sum(over_sdpa[(fmt, b, c)] > 1 for b, c in shapes)
    print(f"{fmt:27s} {wins:>6d} of {len(shapes)} shapes {'':26s}{over_sdpa[(fmt, 64, 4096)]:5.2f}  "
          f"{over_bf16(fmt, 64, 4096):11.2f}")

# %% [markdown]
# ## Against FlashInfer
#
# SDPA reads an unpaged cache; a serving engine's decode reads a paged one. FlashInfer's
# `BatchDecodeWithPagedKVCacheWrapper` reads an "NHD" paged cache, `[pages, 2 (K, V), page size, KV heads, head
# size]`, which is byte for byte minikv's block layout for the formats without inline scales, so it ran on the very
# pools, block tables and queries minikv's kernel read (`minikv/bench/flashinfer_peer.py`), in both of its variants
# (tensor cores, and CUDA cores), the faster one kept. Its output was compared with minikv's on the spot: the
# last column. FlashInfer has no per-token-head format. Above 1, minikv is faster:

# %%
viz_gpu.peer_figure(rows)

# %%
peer = [r for r in decode if r.get("flashinfer_ms") not in (None, "")]
fi_over = {(r["format"], int(r["batch"]), int(r["context"])): r["flashinfer_over_minikv"] for r in peer}
print(f"{'format':6s} {'batch':>5s} {'context':>7s} {'minikv us':>9s} {'FlashInfer us':>13s} {'FI / minikv':>11s}  "
      f"{'FlashInfer variant':18s} {'max |diff|':>10s}")
for r in peer:
    print(f"{short[r['format']]:6s} {int(r['batch']):5d} {int(r['context']):7d} {1e3 * r['ms']:9.1f} "
          f"{1e3 * r['flashinfer_ms']:13.1f} {r['flashinfer_over_minikv']:11.2f}  {r['flashinfer_variant']:18s} "
          f"{r['flashinfer_max_abs_diff']:10.1g}")

# %% [markdown]
# ## Every shape, once
#
# The time of each format at each shape (µs) and, in brackets, how much faster than bf16 paged decode it is there
# (above 1: faster than bf16; below 1: slower). Then the context-attention cases of the same run: causal prefill,
# and the cross-attention context step at six shapes, fused (the fp8 paged cross cache read back) against unfused
# (the bf16 workspace), with the path the engine takes at that shape: fused up to 16 queries per sequence, unfused
# above (`minikv.attention.cross.FUSED_CROSS_MAX_QUERY_LEN`, set from this sweep; the step trace names the path
# and why, `CacheEvent.context_dispatch`).

# %%
order = [f for f in short if f in formats]
print(f"{'batch':>5s} {'context':>7s} " + " ".join(f"{short[f]:>16s}" for f in order) + "   (µs, x bf16)")
for b, c in shapes:
    cells = [f"{ms[(f, b, c)]:7.1f} ({over_bf16(f, b, c):4.2f}x)" for f in order]
    print(f"{b:5d} {c:7d} " + " ".join(f"{x:>16s}" for x in cells))
print(f"\n{'context attention':34s} {'batch':>5s} {'q_len':>6s} {'kv_len':>6s} {'ms':>8s} {'TFLOP/s':>8s}")
for r in rows:
    if r["kind"] in ("prefill", "cross-context"):
        path = f"   the engine takes: {r['engine_path']}" if r.get("engine_path") else ""
        print(f"{r['format']:34s} {int(r['batch']):5d} {int(r['q_len']):6d} {int(r['context']):6d} {r['ms']:8.3f} "
              f"{r['TFLOPs']:8.1f}{path}")

# %% [markdown]
# ## The targets
#
# Every kernel has a target (`minikv.bench.attention.targets`), and so does the engine (`minikv.bench.engine.targets`,
# after the kernels' lines, with the batch-1 comparison reported beside them), each a ratio within this one run.
# The verdict compares the unrounded ratio
# with the target; the ratio is printed rounded *down* to three decimals (`minikv.bench.attention.format_ratio`),
# so a printed ratio reaches its target exactly when the measured one does.

# %%
from minikv.bench import engine as engine_bench

engine_rows = [r for r in rows if r["kind"] == "engine-decode"]
for line in format_targets(rows) + engine_bench.summary(engine_rows):
    print(line)

# %% [markdown]
# ## Against the kernels before these
#
# `data/gpu_attention_previous_kernels.csv` is the same benchmark recorded on an H200 with the decode kernels of
# an earlier version (the 32-bit-word and byte-plane kernels with their swept table). An H200's memory is faster
# than an H100's, so its times and this run's cannot be divided by each other; each run's ratio over its own bf16
# can. At batch 64 / context 4096, each format's speed over bf16 paged decode, in each run:

# %%
previous = {(r["format"], int(r["batch"]), int(r["context"])): 1e3 * r["ms"]
            for r in load(DATA.parent / "gpu_attention_previous_kernels.csv") if r["kind"] == "decode"}
print(f"{'format':27s} {'earlier kernels (H200)':>23s} {'this run (H100)':>16s}   (x bf16 of the same run)")
for fmt in formats:
    before = previous[("auto", 64, 4096)] / previous[(fmt, 64, 4096)]
    print(f"{fmt:27s} {before:22.2f}x {over_bf16(fmt, 64, 4096):15.2f}x")

# %% [markdown]
# ## Where a user feels it: the engine
#
# The kernels inside the whole engine: `minikv.LLM` running a model at gemma-4-E2B's dimensions with random
# weights (35 layers of hidden 1536, 8 query heads over one KV head of 256 on sliding layers and 512 on full
# ones, window 512, the last 20 layers sharing KV; bfloat16), 64 prompts decoded together, tokens/s counted over
# the decode steps only, at two prompt lengths. By default on a GPU the engine captures its decode step in a
# CUDA graph per batch size and replays it (`minikv/engine/cuda_graph.py`); `LLM(..., enforce_eager=True)`
# launches it op by op from Python, as every step ran before. Both are drawn: solid lines replayed, dashed eager
# (bf16). Beside them, in the table's batch-1 line and the reports of the targets cell,
# the same model's decode step with torch SDPA over a contiguous bf16 cache, captured in a graph
# (`minikv/bench/sdpa_step.py`): what the step costs with torch's best attention and no paging, no scheduler.

# %%
viz_gpu.engine_context_figure(rows)

# %%
main_batch = max(int(r["batch"]) for r in engine_rows if r["mode"] == "replayed")
tps = {(r["format"], int(r["batch"]), int(r["context"]), r["mode"]): r["tokens_per_s"] for r in engine_rows}
engine_contexts = sorted({int(r["context"]) for r in engine_rows if int(r["batch"]) == main_batch})
engine_formats = list(dict.fromkeys(r["format"] for r in engine_rows))
print(f"decode tokens/s at batch {main_batch} (x bf16 in the same mode), graphs | eager")
print(f"{'format':22s} " + " ".join(f"{'context ' + str(c):>27s}" for c in engine_contexts))
for f in engine_formats:
    cells = []
    for c in engine_contexts:
        graph, eager = tps.get((f, main_batch, c, "replayed")), tps.get((f, main_batch, c, "eager"))
        g = f"{graph:6.0f} ({graph / tps[('auto', main_batch, c, 'replayed')]:4.2f}x)" if graph else ""
        e = f"{eager:5.0f}" if eager else "    -"
        cells.append(f"{g:>15s} | {e}")
    print(f"{f:22s} " + " ".join(f"{x:>27s}" for x in cells))
one = {r["mode"]: r["ms"] for r in engine_rows if int(r["batch"]) == 1}
print("\nbatch 1, bf16, time per output token: " + ", ".join(f"{m} {ms_:.2f} ms" for m, ms_ in sorted(one.items())))
print(f"prefill tokens/s, {main_batch} prompts per context (graph runs first, eager runs after, same shapes):")
for c in engine_contexts:
    cells = [f"{r['format']} {r['mode']} {r['prefill_tokens_per_s']:,.0f}" for r in engine_rows
             if (int(r["batch"]), int(r["context"])) == (main_batch, c) and r["mode"] in ("replayed", "eager")
             and r.get("prefill_tokens_per_s") not in (None, "")]
    print(f"  context {c}: " + ", ".join(cells))

# %% [markdown]
# ### Where a decode step's time goes
#
# The same engine profiled with `torch.profiler` (`../tools/gpu_probes/engine_step_profile.py steps`: launched
# eagerly, so that every kernel is seen; bf16 and int8 per-token-head, batch 64, context 8192), each kernel's time
# put in a category by its name. Two runs on the H200: before and after the model's RMSNorms became one kernel
# each (`kernels/rms_norm.py`, RoPE and the residual add fused in where they follow a norm). Written with torch
# ops, one norm is about nine launches (a float32 copy, the square, the mean, the epsilon, the reciprocal square
# root, two products, the weight's copy, the cast back) and RoPE five more, and gemma-4 has up to eight norms
# per layer: that was most of the step's launches, each a few microseconds however small. The last line bounds
# what a 1-byte cache can do for this model: even read at its byte limit (half of bf16's attention time), it
# shortens only the attention part of a step.

# %%
PROFILES = DATA.resolve().parents[2] / "results" / "gpu"
profile = {name: [r for r in csv.DictReader(open(PROFILES / folder / "steps_8192.csv")) if r["launches_per_step"]]
           for name, folder in (("torch norms", "decode-profile"), ("fused norms", "engine-fused-norm"))}
print(f"{'decode step, context 8192':30s} {'torch norms':>22s} {'fused norms':>22s}")
for fmt in ("auto", "int8_per_token_head"):
    for cat in ("decode attention", "matmul", "KV cache write", "other", "all kernels"):
        cells = []
        for name in profile:
            got = [r for r in profile[name] if (r["format"], r["phase"]) == (fmt, "decode")
                   and cat in (r["category"], "all kernels")]
            ms_ = sum(float(r["ms_per_step"]) for r in got)
            n = sum(float(r["launches_per_step"]) for r in got)
            cells.append(f"{ms_:6.2f} ms {n:5.0f} launches")
        print(f"{short.get(fmt, fmt) + ' ' + cat:30s} {cells[0]:>22s} {cells[1]:>22s}")
fused = {r["category"]: float(r["ms_per_step"]) for r in profile["fused norms"]
         if (r["format"], r["phase"]) == ("auto", "decode")}
kernels_ms = sum(fused.values())
wall_ms = 1e3 * main_batch / tps[("auto", main_batch, 8192, "replayed")]
print(f"bf16 at context 8192, fused norms: attention {fused['decode attention'] / kernels_ms:.0%} of the kernel "
      f"time; a 1-byte cache at its byte limit would make the step at most "
      f"{kernels_ms / (kernels_ms - fused['decode attention'] / 2):.2f}x faster in kernel time, "
      f"{wall_ms / (wall_ms - fused['decode attention'] / 2):.2f}x in the engine's time per step")

# %% [markdown]
# **Norm pairs, one launch each.** Since that profile, each norm that adds the residual also does the norm that
# reads its result next (`rms_norm(..., next_weight=)`: after attention, the feed-forward's input norm; at a layer's
# end, the next layer's input norm), from the row it already holds: 70 launches fewer per step of this 35-layer
# model, the same bits as before. `data/gpu_engine_norm_pairs_ab.csv` is the engine bench on the trees before and
# after, one after the other in one device call on an H100 (`tools/gpu_probes/engine_ab.sh`; two host trims of the
# graph step went in with the pairs): the replay, all kernels, gains what the launches cost; the step a little more.

# %%
def ab_pairs(name):
    """The engine bench's rows of two trees from one device call, paired: (before, after) per cache and prompt."""
    with open(DATA.parent / name) as f:
        rows = list(csv.DictReader(f))
    before, after = dict.fromkeys(r["tree"] for r in rows)
    print(f"batch {rows[0]['batch']}; before = {before}, after = {after}")
    key = lambda r: (r["format"], r["context"])
    return [(b, next(a for a in rows if a["tree"] == after and key(a) == key(b))) for b in rows if b["tree"] == before]


def same_run_ab(name):
    """A decode change's A/B: each row's step and graph replay, before and after."""
    pairs = ab_pairs(name)
    print(f"{'cache':27s} {'prompt':>6s} {'step ms':>8s} {'after':>6s} {'replay ms':>9s} {'after':>6s} "
          f"{'x faster':>8s}")
    for b, a in pairs:
        print(f"{viz_gpu.label(b['format']):27s} {b['context']:>6s} {float(b['step_ms']):8.2f} "
              f"{float(a['step_ms']):6.2f} {float(b['graph_replay_ms']):9.2f} {float(a['graph_replay_ms']):6.2f} "
              f"{float(b['step_ms']) / float(a['step_ms']):7.2f}x")
        assert float(a["graph_replay_ms"]) < float(b["graph_replay_ms"])


same_run_ab("gpu_engine_norm_pairs_ab.csv")

# %% [markdown]
# **Fused decode matmuls.** Then three of each layer's matmuls took the step after them into their own launch
# (`kernels/decode_matmul.py`): the MLP's gate with up and GELU, the per-layer input's gate with GELU and the input,
# a layer's keys with its values. In a cold-L2 probe on an H100 the MLP's front went from 23.0 to 16.6 us per layer;
# a plain matmul in the same kernel is no faster than cuBLAS, so the others stay torch's. The same A/B on an
# **H200** (`data/gpu_engine_decode_matmul_ab.csv`, `../results/gpu/decode-matmul-2026-12-06/`): 190 launches fewer
# per step.

# %%
same_run_ab("gpu_engine_decode_matmul_ab.csv")

# %% [markdown]
# **Kernels that start while the one ahead ends.** Most of a step's launches are still small: a norm of 64 rows, a
# matmul over a few megabytes, each over in microseconds, and the GPU finished each one completely before it began
# to schedule the next. On Hopper a kernel launched with *programmatic dependent launch* may be scheduled while the
# kernel ahead of it is still running. Its first instruction (`launch.wait_for_inputs()`: griddepcontrol.wait)
# holds it until that kernel's results are visible, then lets the kernel after it be scheduled in turn. Every read
# and write still happens in order; what goes is the gap between kernels. The same A/B on an **H100**
# (`data/gpu_engine_dependent_launch_ab.csv`, made by `tools/engine_ab_csv.py` from the bench's logs in
# `../results/gpu/dependent-launch-2026-12-07-h100/`, whose README has a second round and the GPU tests):

# %%
same_run_ab("gpu_engine_dependent_launch_ab.csv")

# %% [markdown]
# **A layer's q, k and v in two launches.** A layer that writes K/V still made its q, k and v in five launches:
# q's matmul, one matmul for k with v, and a norm each. Now q_proj, k_proj and v_proj write one output from one
# launch (`decode_matmul(..., stack=(k, v))`), and one norm launch reads it (`rms_norm(..., kv=...)`), which picks
# each head's weight and RoPE from the head's index: 45 launches fewer in an E2B step. The same A/B on an **H100**
# (`data/gpu_engine_qkv_ab.csv`, from `../results/gpu/qkv-launch-2026-12-07-h100/`, whose README has two more rounds,
# one at 8192 tokens, and the GPU tests). Read the graph replay: the step's median also carries the host's noise.

# %%
same_run_ab("gpu_engine_qkv_ab.csv")

# %% [markdown]
# ## The engine beside transformers, and at a fixed memory budget
#
# These rows are in the same CSV, added by three later device calls on an H100 of the same kind, with the same
# tree (`../results/gpu/bench-2026-12-07-h100-parts/`, whose README gives each call's command). A table below
# compares rows of one call only.
#
# **transformers' own engine.** With `--peer transformers`, transformers builds one random gemma-4-E2B text model
# and saves it, and both engines take the same 64 prompts of 2,048 random token ids. transformers' prefill is one
# forward with `logits_to_keep=1`; its decode step is its `generate` (dynamic cache, eager, greedy) less that
# prefill, per new token. minikv runs twice: with its defaults, and with `kv_sharing_fast_prefill=True` (vLLM's
# option of that name). The model's last 20 layers write no K/V of their own, so in a prompt only the last token's
# pass through them reaches the output; transformers runs them on that token alone
# (`../results/gpu/prefill-peer-2026-12-05-h100/`), and the option makes minikv do the same.

# %%
peers = [r for r in engine_rows if r["mode"] == "peer"]
theirs = next(r for r in peers if r["engine"].startswith("transformers"))
print(f"{peers[0]['gpu']}: {int(peers[0]['batch'])} prompts of {int(peers[0]['context'])} tokens, bf16, one run")
print(f"{'engine':40s} {'prefill tokens/s':>17s} {'x theirs':>9s} {'decode ms/step':>15s} {'x theirs':>9s}")
for r in peers:
    pre, step = r["prefill_tokens_per_s"], r["decode_ms_per_step"]
    print(f"{r['engine']:40s} {pre:17,.0f} {pre / theirs['prefill_tokens_per_s']:8.2f}x {step:15.2f} "
          f"{theirs['decode_ms_per_step'] / step:8.2f}x")

# %% [markdown]
# **A later tree, another machine.** Since this recording, `ModelRunner.prepare` builds a step's positions and slots
# with array operations per sequence, where it ran a Python loop per token: a prefill step holds 16,384 tokens. The
# same peer rows measured after that change, on another H100 of this kind, are in
# `../results/gpu/prefill-prepare-2026-12-07-h100/` and are not drawn here. There minikv's prefill with
# `kv_sharing_fast_prefill=True` ran far ahead of transformers', by much more than the change saves on a CPU; the
# decode steps, which the change does not touch, were faster on that machine too. So part of the gap is the
# machine, and only an A/B within one call can say how much is the change.

# %% [markdown]
# **Where the prefill's attention time went.** Until this run, the context kernel's tiles at this model's head sizes
# (256 on its sliding layers, 512 on its full ones) were sized to fit shared memory and never timed. A sweep on an
# H100, `data/gpu_context_e2b.csv` (`tools/gpu_probes/e2b_context_sweep.py`; 8 query heads over 1 KV head, every
# tile checked against the torch reference first), timed the old tile and a grid at two shapes: one engine prefill
# step (8 prompts of 2,048 tokens) and one prompt of 32,768. The fastest became `launch.CONTEXT_LONG_256`,
# `CONTEXT_LONG_256_ONE_BYTE` and `CONTEXT_LONG_512` (for 1-byte caches with float16 dot products, which the old
# tiles did not take); the transformers table above ran with them. Each line's two times are from the same run.

# %%
from minikv.kernels import launch

with open(DATA.parent / "gpu_context_e2b.csv") as _f:
    context_sweep = list(csv.DictReader(_f))
tiles_now = {(256, False): launch.CONTEXT_LONG_256, (256, True): launch.CONTEXT_LONG_256_ONE_BYTE,
             (512, False): launch.CONTEXT_LONG_512, (512, True): launch.CONTEXT_LONG_512}
tile_of = lambda r: tuple(int(r[k]) for k in ("block_m", "block_n", "warps", "stages"))  # noqa: E731
print(f"{'head':>4s} {'cache':25s} {'prompts':>9s} {'old tile':>16s} {'µs':>9s} {'new tile':>16s} {'µs':>9s} "
      f"{'x faster':>8s} {'TFLOP/s':>8s}")
for old in (r for r in context_sweep if r["config"] == "default"):
    head, fmt, length = int(old["head_size"]), old["format"], old["length"]
    now = tiles_now[(head, fmt != "auto")]
    new = next(r for r in context_sweep if (r["format"], r["length"], r["config"]) == (fmt, length, "grid")
               and int(r["head_size"]) == head and tile_of(r) == now)
    print(f"{head:4d} {viz_gpu.label(fmt):25s} {old['batch']:>3s}x{length:>5s} {str(tile_of(old)):>16s} "
          f"{float(old['us']):9,.0f} {str(now):>16s} {float(new['us']):9,.0f} "
          f"{float(old['us']) / float(new['us']):7.2f}x {float(new['TFLOPs']):8.0f}")
sdpa_512 = next(r for r in context_sweep if r["config"] == "sdpa causal, no window" and r["head_size"] == "512"
                and r["us"])
print(f"\ntorch's SDPA at head size 512, {sdpa_512['batch']}x{sdpa_512['length']}: {float(sdpa_512['us']):,.0f} µs "
      f"({float(sdpa_512['TFLOPs']):.0f} TFLOP/s; flash attention stops at head size 256)")

# %% [markdown]
# **The same tiles in the engine, in one run.** `data/gpu_engine_tiles_ab.csv`: the engine bench twice on one H100
# in one device call, first a copy of the tree before the tiles (0beb950), then the tree with them (44d25a2), each
# from its own directory (`tools/gpu_probes/engine_ab.sh`). Prefill speeds up, most where prompts are long and bf16's
# kernel is fastest; the graph replay, a decode step, does not move: the tiles are the prefill kernel's.

# %%
tiles_pairs = ab_pairs("gpu_engine_tiles_ab.csv")
print(f"{'cache':27s} {'prompt':>6s} {'prefill tokens/s':>17s} {'after':>9s} {'x faster':>8s} "
      f"{'replay ms':>9s} {'after':>6s}")
for b, a in tiles_pairs:
    pre_b, pre_a = float(b["prefill_tokens_per_s"]), float(a["prefill_tokens_per_s"])
    print(f"{viz_gpu.label(b['format']):27s} {b['context']:>6s} {pre_b:17,.0f} {pre_a:9,.0f} {pre_a / pre_b:7.2f}x "
          f"{float(b['graph_replay_ms']):9.2f} {float(a['graph_replay_ms']):6.2f}")

# %% [markdown]
# The 1-byte formats gain too, but stay slower than bf16 in this kernel: their codes are converted in registers
# before each dot product, and the "row" placement's rows (head size + 4 bytes) are read in 4-byte pieces
# (`../results/gpu/context-e2b-2026-12-06-h100/formats/e2b_context_defaults.txt` has every format).

# %% [markdown]
# **Longer prompts.** The same engine at batch 64 with prompts of 8,192 tokens (the first part of the recording) and
# of 32,768 (a later call). Beside each format's tokens/s and its ratio over bf16's: the same ratio from the median
# decode step; the graph's replay alone over that median step (what the host leaves of a step); the bytes a step
# must read over the measured copy bandwidth, as a share of the replay (`minikv.bench.engine.decode_step_bytes`);
# and the last step's time. The tokens/s count every decode step of the 16, so they also carry the graph's first
# launch, which uploads it, and the last step, which frees every block of the batch in Python.

# %%
long_rows = [r for r in engine_rows if r["mode"] == "replayed" and int(r["batch"]) == main_batch
             and int(r["context"]) >= 8192]
print(f"{'batch 64':28s} {'tokens/s':>8s} {'x bf16':>7s} {'by median':>9s} {'replay / median':>15s} "
      f"{'bound / replay':>14s} {'last step':>10s}")
last_step = {}
for ctx in sorted({int(r["context"]) for r in long_rows}):
    at = {r["format"]: r for r in long_rows if int(r["context"]) == ctx}
    print(f"context {ctx}")
    for fmt, r in at.items():
        tps_, replay = r["decode_tokens_per_s"], r["graph_replay_ms"]
        last_step[(fmt, ctx)] = float(r["steps_ms"].split()[-1])
        print(f"  {viz_gpu.label(fmt):26s} {tps_:8,.0f} {tps_ / at['auto']['decode_tokens_per_s']:6.2f}x "
              f"{at['auto']['step_ms'] / r['step_ms']:8.2f}x {replay / r['step_ms']:14.2f}x "
              f"{r['bound_ms'] / replay:14.0%} {last_step[(fmt, ctx)]:7.0f} ms")
gain = {(r["format"], int(r["context"])): r["graph_replay_ms"] for r in long_rows}
pth = ("int8_per_token_head", "fp8_per_token_head")
assert gain[("auto", 32768)] / gain[("fp8", 32768)] > gain[("auto", 8192)] / gain[("fp8", 8192)]  # fp8 gains more
assert all(gain[(f, c)] > gain[("fp8", c)] for f in pth for c in (8192, 32768))          # per-token-head: less
assert all(last_step[(r["format"], 32768)] > 3 * r["step_ms"] for r in long_rows
           if int(r["context"]) == 32768)                                                 # the last step: long

# %% [markdown]
# Three things show. Attention's share of a step grows with the prompt, so fp8 per tensor, whose kernel reads half
# of bf16's bytes, gains more at 32,768 tokens than at 8,192. The two per-token-head formats gain less: their
# replay reaches a smaller share of its bound than fp8's, and at this model's head size of 512 their "row" kernel
# is the slow part (below). And the last step grows with the prompt to several times a decode step: it frees every
# block of the batch, a Python loop over tens of thousands of blocks (most of that step's host time in a profile at
# 8,192 tokens, `../results/gpu/bench-2026-12-07-h100-parts/prof.txt`). So the tokens/s of 16 new tokens fall
# behind the median step's ratio. (This recording predates a cheaper release: the block manager now keeps no
# object per block and returns a burst of freed blocks to its heap in one heapify. On an H200 that cut the last
# step by about half, `../results/gpu/last-step-2026-12-07-h200/`. bf16's last step was about twice fp8's, so bf16
# gained more: in a later H100 run, which also ran the per-token-head formats through the engine in the block
# placement, fp8's tokens/s over bf16's came out lower than here at both lengths,
# `../results/gpu/block-placement-engine-2026-12-07-h100/`.) The asserts above keep these three true of
# the CSV. (An earlier recording, with older kernels, found the per-token-head formats no faster than bf16 at
# 32,768 tokens.) The cell below reads
# `data/gpu_decode_one_byte_e2b.csv` (`tools/gpu_probes/e2b_decode_sweep.py OUT one-byte`, an H100): the decode
# kernel at the full layers' shape (batch 64, context 8192, 8 query heads over 1 KV head), each format's default
# launch beside the best of 48 others (tokens per tile, warps, stages). The launch is not the problem: the default
# is the best or close to it in every row. The placement is. With one KV head a
# "row" slot is 512 + 4 = 516 bytes, so consecutive rows start at offsets 0, 4, 8, 12 (mod 16), the aligned row
# window of the section on alignment could not apply in that run, and rows were read 4 bytes at a time; the same
# codes with their scales grouped per block ("block") read like fp8 per tensor.

# %%
with open(DATA.parent / "gpu_decode_one_byte_e2b.csv") as _f:
    one_byte_e2b = [r for r in csv.DictReader(_f) if r["us"]]
bf16_us = next(float(r["us"]) for r in one_byte_e2b if (r["format"], r["config"]) == ("auto", "default"))
print(f"head size 512, batch 64, context 8192; bf16 {bf16_us:.0f} µs")
print(f"{'format':34s} {'default µs':>10s} {'best µs':>8s} {'bf16 / default':>15s}")
placement_speed = {}
for fmt in dict.fromkeys(r["format"] for r in one_byte_e2b if r["format"] != "auto"):
    runs = [r for r in one_byte_e2b if r["format"] == fmt]
    default = next(float(r["us"]) for r in runs if r["config"] == "default")
    best = min(float(r["us"]) for r in runs)
    placement_speed[fmt] = bf16_us / default
    print(f"{viz_gpu.label(fmt):34s} {default:10.0f} {best:8.0f} {bf16_us / default:14.2f}x")
assert all(v < 1.25 for f, v in placement_speed.items() if "per_token" in f and "/block" not in f)
assert all(v > 1.5 for f, v in placement_speed.items() if "/block" in f or f == "fp8")

# %% [markdown]
# The phases repeat, though: slot $s$ of a block starts $4s$ bytes (mod 16) past a 16-byte boundary, so every fourth
# slot has the same phase. The kernel therefore gives each class of token positions modulo 4 its own program
# (`PERIOD` in `kernels/decode_attention.py`; `row_window_period` finds the period of any layout): within one
# program every row shares one phase, the aligned window applies again, and the classes' partial results are
# merged like the splits'. The cell below reads `data/gpu_decode_row_window_e2b.csv` (`tools/gpu_probes/
# e2b_decode_sweep.py OUT row-window`, an H200, a different card from the table above): both layer shapes, the
# row placement read 4 bytes at a time and by class (the best of a grid of tiles, warps, stages and program
# counts; `kernels/launch.py` takes the best at head 512), beside bf16 and the block placement.

# %%
with open(DATA.parent / "gpu_decode_row_window_e2b.csv") as _f:
    row_window_e2b = [r for r in csv.DictReader(_f) if r["us"]]
print("bf16's time over each format's, batch 64, context 8192")
print(f"{'layer':22s} {'format':30s} {'4-byte loads':>12s} {'by class':>9s}")
by_class_gain = {}
for head_size in ("512", "256"):
    runs = [r for r in row_window_e2b if r["head_size"] == head_size]
    bf16_e2b = next(float(r["us"]) for r in runs if (r["format"], r["config"]) == ("auto", "default"))
    where = f"head {head_size}" + (", window 512" if head_size == "256" else "")
    for fmt in ("int8_per_token_head", "fp8_per_token_head"):
        four = next(float(r["us"]) for r in runs if (r["format"], r["config"]) == (fmt, "4-byte loads"))
        by_class = min(float(r["us"]) for r in runs if r["format"] == fmt and r["row_window"] == "True")
        by_class_gain[(head_size, fmt)] = four / by_class
        print(f"{where:22s} {viz_gpu.label(fmt):30s} {bf16_e2b / four:11.2f}x {bf16_e2b / by_class:8.2f}x")
    block_us = next(float(r["us"]) for r in runs if r["format"].endswith("/block") and r["config"] == "default")
    print(f"{where:22s} {viz_gpu.label('fp8_per_token_head/block'):30s} {bf16_e2b / block_us:21.2f}x")
assert all(by_class_gain[("512", f)] > 1.2 for f in ("int8_per_token_head", "fp8_per_token_head"))

# %% [markdown]
# Read by class, vLLM's layout catches up with bf16 at the full layers but not with the block placement: the
# alignment was the larger part of the gap, not all of it. What remains is per row: a 16-byte tail piece and its
# small dot product, a scattered 4-byte scale read, and one row in four per program, so each program's reads are
# spread over four times as many lines. Neither placement reads at the speed its bytes allow (the 1-byte ceiling
# of the bullets below).

# %% [markdown]
# **Registers decide how many programs share an SM.** At the attention bench's own shape (head size 128) the
# kernel that reads the row placement by class was held back by its register count. The compiler gave it about 200
# registers a thread, so two programs of four warps fit an SM, and little else hid each tile's wait. Capped at 128
# registers (`max_registers`, which Triton hands the compiler as `maxnreg`) with 64-token tiles, four fit
# (`launch.DECODE_ROW_SCALES`, chosen by `tools/gpu_probes/decode_occupancy.py` from a grid of tiles, stages, caps
# and warps). The cell below reads `data/gpu_decode_register_cap.csv`: the attention bench on an H100, before the
# cap and after it, in one device call (`../results/gpu/decode-instructions-2026-12-07-h100/`). At gemma-4-E2B's
# head size of 512 the same cap is slower: the float32 accumulator of 16 rows by 512 alone takes 64 registers a
# thread, and the rest spills.

# %%
with open(DATA.parent / "gpu_decode_register_cap.csv") as _f:
    cap_rows = list(csv.DictReader(_f))
cap_us = {(r["tree"], r["format"], int(r["batch"]), int(r["context"])): float(r["us"]) for r in cap_rows}
print(f"{cap_rows[0]['gpu']}, one device call: µs per call, and bf16's time over the format's")
print(f"{'row placement':26s} {'batch':>5s} {'context':>7s} {'before':>8s} {'after':>8s} {'faster':>7s} "
      f"{'x bf16 before':>13s} {'after':>6s}")
for fmt in ("int8_per_token_head", "fp8_per_token_head"):
    for batch, ctx in sorted({(b, c) for (_, f, b, c) in cap_us if f == fmt}):
        before, after = cap_us[("before", fmt, batch, ctx)], cap_us[("after", fmt, batch, ctx)]
        print(f"{viz_gpu.label(fmt):26s} {batch:5d} {ctx:7d} {before:8.1f} {after:8.1f} {before / after:6.2f}x "
              f"{cap_us[('before', 'auto', batch, ctx)] / before:12.2f}x "
              f"{cap_us[('after', 'auto', batch, ctx)] / after:5.2f}x")
assert all(cap_us[("after", f, b, c)] < cap_us[("before", f, b, c)] for (t, f, b, c) in cap_us
           if t == "before" and f in ("int8_per_token_head", "fp8_per_token_head") and b >= 16)

# %% [markdown]
# **A fixed budget.** Beyond a faster step at batch 64, a 1-byte cache buys room. `--capacity` asks
# how many sequences of 8,192 prompt tokens (and 16 new ones) fit 16 GiB of K/V in each format
# (`minikv.bench.engine.capacity_batch`), then runs the engine at that batch, where every weight read serves more
# tokens. One device call ran the four formats, so each ratio is against the bf16 row of that call.

# %%
viz_gpu.capacity_figure(engine_rows)

# %%
capacity = [r for r in engine_rows if r["mode"] == "capacity"]
base = next(r for r in capacity if r["format"] == "auto")
for r in capacity:
    tps_ = r["decode_tokens_per_s"]
    print(f"{viz_gpu.label(r['format']):28s} batch {int(r['batch']):4d} ({r['batch'] / base['batch']:.2f}x bf16's)  "
          f"{tps_:7,.0f} decode tokens/s ({tps_ / base['decode_tokens_per_s']:.2f}x)  "
          f"median step {r['step_ms']:5.2f} ms")
assert all(r["batch"] > 1.9 * base["batch"] for r in capacity if r["format"] != "auto")

# %% [markdown]
# ## What the figures say
#
# The cell below checks each statement of this section against the CSV (it fails if a new recording changes one),
# then prints the figures it rests on.

# %%
big = [(b, c) for b, c in shapes if b >= 16 and c >= 4096]
one_byte = [f for f in formats if f != "auto"]
row_pth = ["int8_per_token_head", "fp8_per_token_head"]
block_pth = [f + "/block" for f in row_pth]
assert all(over_bf16(f, b, c) > 1 for f in one_byte for b, c in shapes if b >= 16)      # none slower at batch >= 16
assert all(over_bf16(f, b, c) < 1 for f in one_byte for b, c in shapes if b == 1 and c == 512)  # all slower here
assert all(ms[(f, b, c)] > ms[(f + "/block", b, c)] for f in row_pth for b, c in big)    # block beats row
assert all(over_bf16(f, b, c) < nbytes[("auto", b, c)] / nbytes[(f, b, c)]                # short of the bytes
           for f in one_byte for b, c in shapes)
assert not any(over_sdpa[("auto", b, c)] > 1 for b, c in shapes)                         # bf16 never beats SDPA
assert all(over_sdpa[(f, b, c)] > 1 for f in one_byte for b, c in big)                   # every 1-byte format does
assert all(previous[("auto", 64, 4096)] / previous[(f, 64, 4096)] < 1 < over_bf16(f, 64, 4096)
           for f in row_pth)                                                               # row: from slower to faster
for f in row_pth:
    g = f + "/block"
    lo, hi = min(ms[(f, b, c)] / ms[(g, b, c)] for b, c in big), max(ms[(f, b, c)] / ms[(g, b, c)] for b, c in big)
    print(f"{f}: block placement {lo:.2f}-{hi:.2f}x faster than row at batch >= 16, context >= 4096")
for f in one_byte:
    worst = min(big, key=lambda s: over_bf16(f, *s))
    print(f"{f:26s} x bf16 paged, worst at batch >= 16 and context >= 4096: {over_bf16(f, *worst):.2f}")
fi_large = {k: v for k, v in fi_over.items() if k[1] >= 16}
assert all(v > 1.1 for k, v in fi_large.items() if k[0] == "fp8")                         # fp8: ahead of FlashInfer
assert all(0.9 < v < 1.2 for k, v in fi_over.items() if k[0] == "auto")                   # bf16: about even
for f in ("auto", "fp8"):
    vals = [v for k, v in fi_large.items() if k[0] == f]
    print(f"{short[f]:4s} FlashInfer time / minikv time at batch >= 16: {min(vals):.2f}x-{max(vals):.2f}x")
graphs_over_eager = {c: tps[("auto", main_batch, c, "replayed")] / tps[("auto", main_batch, c, "eager")]
                     for c in engine_contexts if ("auto", main_batch, c, "eager") in tps}
assert all(x > 3 for x in graphs_over_eager.values())                                     # graphs: several x eager
replay = {(r["format"], int(r["context"])): float(r["graph_replay_ms"]) for r in engine_rows
          if r["mode"] == "replayed" and int(r["batch"]) == main_batch}
assert all(replay[(f, c)] < replay[("auto", c)] for f in one_byte if f in engine_formats
           for c in engine_contexts)                                                       # 1-byte: faster steps
assert all(replay[("fp8", c)] == min(replay[(f, c)] for f in engine_formats) for c in engine_contexts)  # fp8 first
assert all(0.6 < replay[(f, c)] / (1e3 * main_batch / tps[(f, main_batch, c, "replayed")]) < 0.95  # host: 5-40%
           for f in engine_formats for c in engine_contexts)
assert one["replayed"] < one["sdpa-graph"] < one["eager"]                                 # batch 1
print("bf16 engine decode, graphs over eager at batch 64: "
      + ", ".join(f"context {c} {x:.1f}x" for c, x in graphs_over_eager.items()))

# %% [markdown]
# The profile the bullets below quote: Nsight Compute on the decode kernel at batch 64 / context 4096, an earlier
# H200 run, for bf16, int8 per-token-head in the row placement (the row window) and in the block placement
# (`../results/gpu/decode-speed/ncu_summary.txt`, one line per launch). It is of the row kernel *before* its
# registers were capped (the section on the cap, above), which is why it shows two programs per SM:

# %%
import re

NCU = DATA.resolve().parents[2] / "results" / "gpu" / "decode-speed" / "ncu_summary.txt"
profiled = {}
for line in NCU.read_text().splitlines():
    launch = int(re.match(r"launch (\d+)", line).group(1))
    fields = (part.split("=", 1) for part in line.split(":", 1)[1].split(";"))
    profiled[launch] = {k.strip(): float(re.match(r"[\d,.]+", v.strip()).group(0).replace(",", ""))
                        for k, v in fields}
for launch, what in ((0, "bf16"), (2, "int8 p.t.h., row window"), (6, "int8 p.t.h., block placement")):
    p = profiled[launch]
    print(f"{what:29s} {p['regs']:3.0f} registers/thread, {p['dyn smem/block'] / 1024:5.1f} KiB shared memory per "
          f"program, {min(p['lim smem'], p['lim regs']):.0f} programs per SM, DRAM {p['DRAM %']:.0f}%, L2 hit {p['L2 hit %']:.0f}%")

# %% [markdown]
# * **bf16** paged decode reads the cache at about the speed of a device copy once the step is large (on the
#   roofline's line in the figure above) and is about even with FlashInfer's paged decode on the same pools (both
#   read at the copy bandwidth there). It trails SDPA on an unpaged cache by a few percent at most shapes and by more
#   at the small ones (batch 16, context 512), where a fixed cost of launches and the pipeline's start is a visible
#   share: the targets cell has the worst shape.
# * **fp8 per tensor** is minikv's fastest format and ahead of FlashInfer's fp8 decode at every shape with batch
#   >= 16: the same bytes, read and converted in minikv's pipelined kernel (1-byte codes staged through shared
#   memory, converted to float16 by the packed hardware instruction as they are read).
# * **Every 1-byte format is faster than bf16 at every shape with batch >= 16**, and faster than the best unpaged
#   bf16 kernel (SDPA) at every large one. At batch 1 / context 512 every one of them is slower: a step that small
#   is its fixed costs. None gets the speed-up its bytes allow (exercise 1 works it out): every 1-byte point sits
#   above the roofline.
# * **The row placement is the alignment issue.** With vLLM's layout (the engine's default) rows start at offsets
#   0, 4, 8, 12 (mod 16). The kernel reads each as two aligned pieces (a window and a 16-byte tail, so that every load
#   is a 16-byte vector) and caps its registers so that four programs fit an SM instead of two
#   (`launch.DECODE_ROW_SCALES`). With both, the row placement went from slower than bf16 (the earlier kernels'
#   run, the table "Against the kernels before these") to faster. It still pays for the alignment: the **fix**, the
#   block placement (the same bytes, rows 16-byte aligned and a tile's scales in one contiguous read), is faster
#   than the row placement at every large shape (the ratios printed above), close to fp8 per tensor, which reads
#   the same rows without scales.
# * **What is left** is the 1-byte kernel's own ceiling, the same for fp8 and both block-placed formats: in the
#   profile above, their kernel holds about 107 KiB of shared memory per program (five tiles of K and V in flight
#   and V's float16 copy, which the PV dot product needs transposed), so two programs fit an SM where bf16's kernel
#   fits four, and it reaches a smaller share of DRAM bandwidth than bf16's. Closing it needs more bytes in flight
#   per byte of shared memory (V transposed from its 1-byte form instead of a float16 copy) and fewer instructions
#   per token.
# * **The engine** with CUDA graphs decodes several times faster than launched eagerly. The host's share of a step
#   (scheduling, input copies, sampling: the engine's time per step against its captured step replayed back to
#   back) is 5-40%, and it is what the step-versus-replay targets miss by. (Later H100 runs, after the block
#   release and the block-table snapshots got cheaper on the host, met those targets at 2,048, 8,192 and 32,768
#   tokens: `../results/gpu/v-parts-and-context-2048-2026-12-07-h100/`.) Its GPU time differs by format as the
#   kernels do: every 1-byte format's captured step is faster than bf16's at every context, fp8 per tensor's the
#   fastest; in tokens/s the host's share, which varies from run to run, can reorder formats whose steps are close.
#   At batch 1 the engine's step is faster than the same model's step with torch SDPA over a contiguous cache, both
#   captured (the table above). Prefill runs eagerly in both modes, one varlen context-attention launch per layer:
#   its tokens/s per run are in the table and the targets cell.
# * **The cross-attention context step**: with a few queries per sequence the fused kernel, reading fp8 from the
#   paged cache, beats the unfused one reading bf16; from 32 queries per sequence it is slower, so the engine
#   dispatches by shape and the step is never slower than unfused. Causal prefill stays short of SDPA's TFLOP/s
#   (the targets above).
#
# ## Try it yourself
#
# Three questions answered from the committed CSVs alone (they run anywhere, no GPU), in the style of Sebastian
# Raschka's *LLMs from scratch*. Each has three cells: put your answer into the first (replace `None`) and run it;
# the second computes the true answer from the CSV and says whether yours is right, without printing it; the third
# is the worked solution, folded (in JupyterLab, click the bar left of it; on the docs site, click "Solution").
#
# **Exercise 1: what do the bytes allow?** At batch 64 / context 4096, int8 per-token-head moves fewer bytes than
# bf16. If both kernels ran exactly at the roofline, how many times faster would int8 be? (Within 0.05 counts.)

# %% tags=["exercise"]
my_answer_1 = None   # your answer: a speed-up (a number)

# %% tags=["check"]
from minikv.viz.exercises import check

allowed = nbytes[("auto", 64, 4096)] / nbytes[("int8_per_token_head", 64, 4096)]
check("Exercise 1", my_answer_1, allowed, abs_tol=0.05)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: a little under 2x. A 1-byte code is half a bf16 element, but each row also carries its 4-byte scale,
# and the queries, block tables and outputs do not shrink at all. The share of that speed-up each 1-byte format
# really gets is its measured speed-up over it.
assert 1.8 < allowed < 2.0
for f in one_byte:
    ideal = nbytes[("auto", 64, 4096)] / nbytes[(f, 64, 4096)]
    assert over_bf16(f, 64, 4096) < ideal
    print(f"{f:26s} bytes allow {ideal:.2f}x, measured {over_bf16(f, 64, 4096):.2f}x")
print("answer:", f"{allowed:.2f}x")

# %% [markdown]
# **Exercise 2: same tokens, same time?** Batch 64 with context 16384 and batch 256 with context 4096 both hold
# 1,048,576 cached tokens. What is the ratio of bf16's decode times at the two shapes, time(batch 64, context
# 16384) / time(batch 256, context 4096)? (Within 0.1 counts.)

# %% tags=["exercise"]
my_answer_2 = None   # your answer: a ratio (a number)

# %% tags=["check"]
bf16_ratio = ms[("auto", 64, 16384)] / ms[("auto", 256, 4096)]
check("Exercise 2", my_answer_2, bf16_ratio, abs_tol=0.1)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: about 1. Decode reads every cached token once, so a memory-bound step costs what its bytes cost; equal
# tokens are equal bytes (to within the queries and outputs, 4x more sequences at batch 256). (A kernel that splits
# the two shapes differently, as the 1-byte ones do, can be a little off that.)
for f in ("auto", "int8_per_token_head/block"):
    t_ratio = ms[(f, 64, 16384)] / ms[(f, 256, 4096)]
    b_ratio = nbytes[(f, 64, 16384)] / nbytes[(f, 256, 4096)]
    assert abs(b_ratio - 1) < 0.01 and (f != "auto" or abs(t_ratio - 1) < 0.1)
    print(f"{f:26s} bytes ratio {b_ratio:.2f}, time ratio {t_ratio:.2f}")
print("answer:", f"{bf16_ratio:.2f}")

# %% [markdown]
# **Exercise 3: how far apart are two runs?** `results/gpu/dependent-launch-2026-12-07-h100/profile/att_b16.csv` is
# another run of the same benchmark with the same decode kernels, on an H100 in an earlier device call the same day
# (batch 16 and 64, context 4096). What is the largest difference, in percent, between the two runs' decode times
# for any format at batch 64? (Within 2 percentage points counts.) Why do the targets compare ratios within one
# run?

# %% tags=["exercise"]
my_answer_3 = None   # your answer: a percentage (a number)

# %% tags=["check"]
RESULTS = DATA.resolve().parents[2] / "results" / "gpu"
other = {(r["format"], int(r["batch"]), int(r["context"])): 1e3 * r["ms"]
         for r in load(RESULTS / "dependent-launch-2026-12-07-h100" / "profile" / "att_b16.csv")
         if r["kind"] == "decode"}
common = [k for k in ms if k in other and k[1] == 64]
worst = max(common, key=lambda k: abs(ms[k] / other[k] - 1))
check("Exercise 3", my_answer_3, 100 * abs(ms[worst] / other[worst] - 1), abs_tol=2)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: the runs agree to within a few percent. A speed-up computed within one run cancels whatever moved
# every kernel of that run together (clocks, temperature, the state of the GPU), which is why every target is a
# ratio within one run.
assert len(common) > 0 and abs(ms[worst] / other[worst] - 1) < 0.1
print("answer:", f"{100 * abs(ms[worst] / other[worst] - 1):.0f}% ({worst[0]}, batch {worst[1]}, context {worst[2]}; "
      f"{len(common)} cases in both runs)")

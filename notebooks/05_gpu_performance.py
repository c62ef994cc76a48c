# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Performance on a GPU
#
# The notebooks so far ran the Triton kernels in the interpreter, where speed means nothing. Here the same kernels
# are compiled for an NVIDIA H200 and measured against two things that do mean something:
#
# * **the hardware**: a paged decode step is a memory-bound read of the KV cache, so its ceiling is the memory
#   bandwidth. We measure two ceilings in the same run: a device-to-device copy (bytes read + written per second)
#   and a read-only pass (a sum over a few GiB);
# * **the best unpaged kernel torch has**: `scaled_dot_product_attention` over a contiguous bf16 cache of the same
#   shape. Paging adds an indirection through the block table; quantization removes bytes.
#
# **How this notebook is tested.** The cells marked `NBVAL_SKIP` ran on the H200 and their outputs were recorded
# there; on a CPU (in CI) nbval shows those recorded outputs without running them, because there is no GPU. Every
# other cell reads the CSV the GPU run wrote (`notebooks/data/gpu_attention.csv`, committed) and is re-executed and
# compared everywhere.

# %%
import csv
from pathlib import Path

import matplotlib.pyplot as plt

DATA = next(p for p in (Path("data/gpu_attention.csv"), Path("notebooks/data/gpu_attention.csv"))
            if p.parent.exists())

# %% [markdown]
# ## The measurement (GPU only)
#
# Paged decode: 32 query heads, 8 KV heads (GQA 4:1), head size 128, block size 16, blocks in shuffled order, at
# batch 1/16/64/256 and context 512/4096/16384, for the four cache formats. Every time is the median of 20 runs
# timed with CUDA events, the L2 cache flushed before each, and each run is a replay of a CUDA graph holding the
# call, as a real engine captures its decode step: that takes Python's launch overhead (about 0.1 ms for a Triton
# launch, more than a small decode step's whole GPU time) out of both minikv's and SDPA's figures. Then causal
# prefill (batch 8, length 4096) and the
# cross-attention context step, fused (reading the fp8 paged cache, taught its format) against unfused (reading
# the bf16 workspace). The code is `minikv/bench/attention.py`; `python -m minikv.bench attention --csv out.csv`
# runs the same thing from a shell.

# %%
# NBVAL_SKIP
from minikv.bench import attention

rows = attention.run()
attention.write_csv(rows, DATA)

# %% [markdown]
# ## Results (from the recorded CSV)

# %%
TEXT_COLUMNS = ("kind", "format", "gpu", "torch", "triton", "timing", "sdpa_timing")


def load(path):
    with open(path) as f:
        out = []
        for r in csv.DictReader(f):
            out.append({k: (float(v) if k not in TEXT_COLUMNS and v != "" else v)
                        for k, v in r.items()})
        return out


rows = load(DATA)
first = rows[0]
print(f"GPU: {first['gpu']}, torch {first['torch']}, triton {first['triton']}")
print(f"ceilings: copy {first['copy_GBps']:.0f} GB/s, read-only {first['read_GBps']:.0f} GB/s")
decode = [r for r in rows if r["kind"] == "decode"]
batches = sorted({int(r["batch"]) for r in decode})
contexts = sorted({int(r["context"]) for r in decode})
formats = list(dict.fromkeys(r["format"] for r in decode))

# %%
fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.6), sharey=True)
for ax, ctx in zip(axes, contexts):
    for fmt in formats:
        pts = sorted((int(r["batch"]), r["GBps"]) for r in decode if r["format"] == fmt and r["context"] == ctx)
        ax.plot([b for b, _ in pts], [g for _, g in pts], marker="o", label=fmt)
    ax.axhline(first["copy_GBps"], color="black", linestyle="--", linewidth=1, label="device copy")
    ax.set_xscale("log", base=2)
    ax.set_title(f"context {ctx}")
    ax.set_xlabel("batch")
axes[0].set_ylabel("achieved GB/s (KV + scales + q read, out written)")
axes[-1].legend(fontsize=7)
fig.suptitle("Paged decode bandwidth against the copy ceiling")
fig.tight_layout()

# %% [markdown]
# Speed relative to SDPA on a contiguous bf16 cache of the same shape (SDPA time / minikv time; above 1 means
# minikv is faster). A 1-byte format reads about half the bytes of bf16, so where decode is bound by memory it
# *could* run up to about 1.9x faster than any bf16 kernel; the curves show how much of that each format gets.

# %%
fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.4), sharey=True)
for ax, ctx in zip(axes, contexts):
    for fmt in formats:
        pts = sorted((int(r["batch"]), r["sdpa_over_minikv"]) for r in decode
                     if r["format"] == fmt and r["context"] == ctx)
        ax.plot([b for b, _ in pts], [s for _, s in pts], marker="o", label=fmt)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_title(f"context {ctx}")
    ax.set_xlabel("batch")
axes[0].set_ylabel("SDPA time / minikv time")
axes[-1].legend(fontsize=7)
fig.tight_layout()

# %%
print(f"{'format':22s} {'batch':>5s} {'context':>7s} {'us':>9s} {'GB/s':>7s} {'% copy':>7s} {'SDPA/minikv':>11s}")
for r in decode:
    print(f"{r['format']:22s} {int(r['batch']):5d} {int(r['context']):7d} {1e3 * r['ms']:9.1f} {r['GBps']:7.0f} "
          f"{r['pct_copy']:6.0f}% {r['sdpa_over_minikv']:11.2f}")
print()
for r in rows:
    if r["kind"] != "decode":
        print(f"{r['format']:34s} batch {int(r['batch']):3d} q_len {int(r['q_len']):5d} kv_len {int(r['context']):5d}"
              f"  {r['ms']:8.3f} ms  {r['TFLOPs']:6.1f} TFLOP/s")

# %% [markdown]
# ## The targets
#
# Each target is a ratio measured within the one run above (`minikv.bench.attention.targets`); the verdict
# compares the same three-decimal value that is printed.

# %%
from minikv.bench.attention import format_targets

for line in format_targets(rows):
    print(line)

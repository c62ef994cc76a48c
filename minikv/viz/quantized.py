"""Figures of the quantized KV cache: per-(token, head) scales, dequantized K magnitudes, the damaged
requests by scheduled batch, a cache row's byte layout, quantization error by format (notebooks 02 and 03).
See docs/internals.md#viz-quantized."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from .style import (
    EMPTY,
    FONT,
    MAX_WIDTH_IN,
    NEUTRAL,
    POOL_COLOURS,
    RIGHT,
    SCALE,
    WRONG,
    as_token_head,
    new_figure,
    to_numpy,
)

# ---- quantized KV cache ------------------------------------------------------------------------------------

def scale_heatmap(scales_before, scales_after, title: str = "Per-(token, head) scales",
                  labels: tuple[str, str] = ("before", "after")) -> Figure:
    """Side-by-side heatmaps of inline scales, log colour scale shared by both panels."""
    before = as_token_head(scales_before, "scales_before")
    after = as_token_head(scales_after, "scales_after")
    if before.shape != after.shape:
        raise ValueError(f"scales_before {before.shape} and scales_after {after.shape} must have the same shape")
    positive = np.concatenate([before[before > 0], after[after > 0]])
    vmin, vmax = (positive.min(), positive.max()) if positive.size else (1e-3, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin / 2, vmax * 2
    norm = LogNorm(vmin=vmin, vmax=vmax)
    cmap = plt.get_cmap("viridis").with_extremes(bad=EMPTY)

    fig, axes = new_figure(1, 2, figsize=(8.0, 4.5), sharey=True)
    for ax, data, label in zip(axes, (before, after), labels):
        image = ax.imshow(np.ma.masked_less_equal(data.T, 0), aspect="auto", interpolation="nearest",
                          norm=norm, cmap=cmap, origin="lower")
        ax.set_title(label)
        ax.set_xlabel("token (slot)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("kv head")
    fig.colorbar(image, ax=axes, label="scale (log)")
    fig.suptitle(title)
    return fig


def k_magnitude_plot(clean_k, wiped_k, title: str = "Dequantized K magnitude",
                     labels: tuple[str, str] = ("clean", "wiped")) -> Figure:
    """Per-token max |K| of a clean and a damaged dequantization, log y, with the median inflation in the
    title."""
    clean = to_numpy(clean_k, "clean_k")
    wiped = to_numpy(wiped_k, "wiped_k")
    if clean.shape != wiped.shape or clean.ndim < 1:
        raise ValueError(f"clean_k {clean.shape} and wiped_k {wiped.shape} must have the same, non-scalar shape")
    clean_mag = np.abs(clean.reshape(clean.shape[0], -1)).max(axis=1)
    wiped_mag = np.abs(wiped.reshape(wiped.shape[0], -1)).max(axis=1)
    ok = clean_mag > 0
    inflation = float(np.median(wiped_mag[ok] / clean_mag[ok])) if ok.any() else float("nan")

    fig, ax = new_figure()
    tokens = np.arange(clean_mag.shape[0])
    ax.plot(tokens, clean_mag, "o-", color=RIGHT, label=labels[0], markersize=3)
    ax.plot(tokens, wiped_mag, "s-", color=WRONG, label=labels[1], markersize=3)
    ax.set_yscale("log")
    ax.set_xlabel("token")
    ax.set_ylabel("max |K| per token (log)")
    ax.set_title(f"{title}: median inflation x{inflation:.3g}")
    ax.legend()
    return fig


def request_grid(damaged: Sequence[bool], max_num_seqs: int, title: str = "Requests by scheduled batch") -> Figure:
    """Requests laid out as batches (rows) x batch slots (columns), green when right and red when wrong."""
    if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be a positive int, got {max_num_seqs!r}")
    flags = [bool(d) for d in damaged]
    if not flags:
        raise ValueError("damaged must list at least one request")
    rows = math.ceil(len(flags) / max_num_seqs)
    grid = np.full((rows, max_num_seqs), -1.0)
    for i, bad in enumerate(flags):
        grid[i // max_num_seqs, i % max_num_seqs] = 1.0 if bad else 0.0

    fig, ax = new_figure(figsize=(max(4.0, 0.55 * max_num_seqs + 2), max(2.0, 0.4 * rows + 1.2)))
    cmap = ListedColormap([EMPTY, RIGHT, WRONG])
    ax.imshow(grid + 1, cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    for i in range(len(flags)):
        ax.text(i % max_num_seqs, i // max_num_seqs, str(i), ha="center", va="center", fontsize=FONT + 1,
                color="white")
    ax.set_xticks(range(max_num_seqs))
    ax.set_yticks(range(rows))
    ax.set_xlabel("slot in batch (cell: request number)")
    ax.set_ylabel("batch")
    ax.set_title(f"{title}: {sum(flags)} of {len(flags)} wrong")
    ax.legend(handles=[Patch(color=RIGHT, label="right"), Patch(color=WRONG, label="wrong")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def row_layout_diagram(layout, title: str | None = None) -> Figure:
    """The bytes of one cache block, one slot and one row, from a KVLayout."""
    needed = ("kv_cache_dtype", "head_size", "elem_bytes", "row_bytes", "slot_bytes", "kv_bytes", "block_bytes",
              "num_kv_heads", "block_size", "scale_offset")
    missing = [a for a in needed if not hasattr(layout, a)]
    if missing:
        raise TypeError(f"row_layout_diagram needs a KVLayout (missing attributes: {', '.join(missing)})")

    fig, axes = new_figure(3, 1, figsize=(8.0, 4.2))
    code_bytes = layout.head_size * layout.elem_bytes
    bars = [
        ("block", layout.block_bytes,
         [("K", 0, layout.kv_bytes, POOL_COLOURS[0]), ("V", layout.kv_bytes, layout.block_bytes, POOL_COLOURS[1])],
         f"{layout.block_size} slots for K, then {layout.block_size} for V"),
        ("slot", layout.slot_bytes,
         [(f"head {h}", h * layout.row_bytes, (h + 1) * layout.row_bytes, POOL_COLOURS[h % 2 * 2])
          for h in range(layout.num_kv_heads)],
         f"{layout.num_kv_heads} kv head row(s)"),
        ("row", layout.row_bytes,
         [(f"{layout.head_size} x {layout.elem_bytes} B", 0, code_bytes, POOL_COLOURS[3])]
         + ([("scale", layout.scale_offset, layout.scale_offset + 4, SCALE)] if layout.scale_offset >= 0 else []),
         "codes | fp32 scale" if layout.scale_offset >= 0
         else "elements; one K and one V scale per layer, outside the pool" if getattr(layout, "has_layer_scales", 0)
         else "elements, no scales"),
    ]
    for ax, (name, total, parts, note) in zip(axes, bars):
        for label, start, end, colour in parts:
            ax.add_patch(Rectangle((start, 0), end - start, 1, facecolor=colour, edgecolor="white"))
            if (end - start) / total > 0.06:
                ax.text((start + end) / 2, 0.5, label, ha="center", va="center", color="white", fontsize=FONT + 1)
        ax.set_xlim(0, total)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ticks = sorted({0, total, *[p[1] for p in parts]})
        # Neighbouring offsets closer than 4% of the bar would print on top of each other: keep the first.
        kept = [t for i, t in enumerate(ticks) if i == 0 or t - ticks[i - 1] > 0.04 * total or t == total]
        kept = [t for i, t in enumerate(kept) if t == total or i + 1 == len(kept) or kept[i + 1] - t > 0.04 * total]
        ax.set_xticks(kept)
        ax.tick_params(axis="x", labelsize=FONT)
        ax.set_title(f"{name}: {total} bytes ({note})", fontsize=9, loc="left")
    fig.suptitle(title or f"{layout.kv_cache_dtype} cache layout")
    return fig


def quant_error_plot(errors_by_format: Mapping[str, object], title: str = "Quantization error by KV cache format",
                     ylabel: str = "|dequantized - original|") -> Figure:
    """Mean (bar) and max (dot) absolute error for each format, log y; zero errors are shown as "0"."""
    if not errors_by_format:
        raise ValueError("errors_by_format must name at least one format")
    names = list(errors_by_format)
    errors = [np.abs(to_numpy(errors_by_format[n], f"errors_by_format[{n!r}]")).ravel() for n in names]
    means = np.array([e.mean() if e.size else 0.0 for e in errors])
    maxes = np.array([e.max() if e.size else 0.0 for e in errors])
    positive = np.concatenate([means[means > 0], maxes[maxes > 0]])
    floor = positive.min() / 10 if positive.size else 1e-12

    fig, ax = new_figure(figsize=(min(MAX_WIDTH_IN, max(5.0, 1.5 * len(names) + 1)), 4.0))
    x = np.arange(len(names))
    ax.bar(x, np.maximum(means, floor), color=POOL_COLOURS[0], label="mean")
    ax.plot(x, np.maximum(maxes, floor), "o", color=NEUTRAL, label="max")
    for xi, mean in zip(x, means):
        ax.text(xi, max(mean, floor), f"{mean:.2g}" if mean > 0 else "0", ha="center", va="bottom", fontsize=FONT)
    ax.set_yscale("log")
    ax.set_xticks(x, names, fontsize=FONT + 1)
    ax.set_ylabel(f"{ylabel} (log)")
    ax.set_title(title)
    ax.legend()
    return fig

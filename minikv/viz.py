"""The matplotlib figures the notebooks show.

Every function takes plain data (lists, NumPy arrays or torch tensors) and returns a new
`matplotlib.figure.Figure`. Nothing is shown and nothing is left behind in pyplot: each figure is created with
`plt.subplots` and then closed in pyplot, so it is drawn exactly once when a notebook cell returns it (the inline
backend does not also flush it) and a script can simply call `fig.savefig(...)`.

    fig = minikv.viz.request_grid(damaged, max_num_seqs=4)
    fig            # last expression of a notebook cell: shown once
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

# Colour means one thing in every figure: red is WRONG and nothing else (a damaged request, a wiped scale, a block
# outside its pool); green is RIGHT. Neutral marks (a maximum, a reference line, a row's scale bytes) use the others.
RIGHT = "#4c9a2a"       # green: a correct request / a block inside its pool
WRONG = "#c0392b"       # red: a damaged request / a block outside its pool
NEUTRAL = "#333333"     # dark grey: a statistic or reference line that is neither right nor wrong
SCALE = "#d4a017"       # gold: the inline fp32 scale bytes of a row
EMPTY = "#eeeeee"
POOL_COLOURS = ("#4878a8", "#e8a33d", "#7a5aa6", "#3a9d8f", "#b5651d")
GUARD = "#999999"


# How the figures are shown: saved at DPI dots per inch (the notebooks' inline backend and the docs build both use
# 100), at most MAX_WIDTH_IN wide, for a content column SHOWN_WIDTH_PX wide (the figure plus the inline backend's
# tight-bbox margin; the docs site's column and JupyterLab's output area on a 1400-pixel window are wider), so that
# no figure is scaled down there. At that size no text may be smaller than MIN_FONT_PT (CSS points: a browser shows
# 96 pixels per inch). `legibility_problems` checks a figure against this.
DPI = 100
MAX_WIDTH_IN = 8.0
SHOWN_WIDTH_PX = 840
MIN_FONT_PT = 8.0
FONT = 8.0              # the smallest font size the figures use (8 pt at DPI 100 shows as 8.3 pt)


def _new_figure(nrows: int = 1, ncols: int = 1, figsize=(7.0, 4.0), **kwargs) -> tuple[Figure, object]:
    width, height = figsize
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(width, MAX_WIDTH_IN), height), layout="constrained",
                             dpi=DPI, **kwargs)
    plt.close(fig)      # detach from pyplot: the caller owns the figure
    return fig, axes


def _text_fits(ax, text: str, width: float, span: float, fontsize: float = FONT) -> bool:
    """Whether `text` fits into `width` of the `span` data units along ax's x extent (estimated from the figure's
    size: about 0.6 em per character)."""
    axes_px = ax.get_position().width * ax.figure.get_figwidth() * ax.figure.dpi
    return width / span * axes_px >= 0.62 * fontsize * ax.figure.dpi / 72 * len(text) + 2


def drawn_texts(fig: Figure, dpi: int = DPI) -> list[dict]:
    """Every piece of text the figure really draws (ticks outside the view and empty strings are not drawn), as
    {"text", "points" (font size), "bbox" (x0, y0, x1, y1) in pixels of a `dpi` rendering, "clipped" (cut by its
    clip box)}, read by rendering the figure once with the Agg renderer."""
    import io
    from unittest import mock

    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg

    found = []
    original = RendererAgg.draw_text

    def recording(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if s and s.strip():
            if mtext is not None:
                box = mtext.get_window_extent(self)
                bbox = (box.x0, box.y0, box.x1, box.y1)
            else:           # one line of a multi-line text: (x, y) is its baseline, y counted from the top
                w, h, d = self.get_text_width_height_descent(s, prop, ismath)
                base = self.height - y
                bbox = (x, base - d, x + w, base + h - d)
            clip = gc.get_clip_rectangle()
            clipped = clip is not None and not (clip.x0 - 1 <= bbox[0] and bbox[2] <= clip.x1 + 1
                                                and clip.y0 - 1 <= bbox[1] and bbox[3] <= clip.y1 + 1)
            found.append({"text": s, "points": prop.get_size_in_points(), "bbox": bbox, "clipped": clipped})
        return original(self, gc, x, y, s, prop, angle, ismath, mtext)

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    with mock.patch.object(RendererAgg, "draw_text", recording):
        canvas.print_figure(io.BytesIO(), format="png", dpi=dpi)
    return found


def legibility_problems(fig: Figure, shown_width_px: float = SHOWN_WIDTH_PX, min_pt: float = MIN_FONT_PT,
                        dpi: int = DPI) -> list[str]:
    """What makes a figure hard to read where it is shown `shown_width_px` wide (or at its own width, if smaller):
    text smaller than `min_pt` CSS points there, text cut off by the figure's edge or by its clip box, and texts
    drawn over each other. An empty list means every text is legible."""
    width_px, height_px = fig.get_figwidth() * dpi, fig.get_figheight() * dpi
    scale = min(1.0, shown_width_px / width_px)
    texts = drawn_texts(fig, dpi)
    problems = []
    for t in texts:
        shown = t["points"] * dpi / 96 * scale
        if shown < min_pt - 1e-6:
            problems.append(f"{t['text']!r}: {t['points']:g} pt shows as {shown:.1f} pt (< {min_pt:g}) at "
                            f"{min(width_px, shown_width_px):.0f} px wide")
        x0, y0, x1, y1 = t["bbox"]
        if x0 < -1 or y0 < -1 or x1 > width_px + 1 or y1 > height_px + 1:
            problems.append(f"{t['text']!r}: drawn past the figure's edge")
        if t["clipped"]:
            problems.append(f"{t['text']!r}: cut off by its axes")
    boxes = np.array([t["bbox"] for t in texts]).reshape(-1, 4)
    for i in range(len(texts)):
        a = boxes[i]
        ox = np.minimum(a[2], boxes[i + 1:, 2]) - np.maximum(a[0], boxes[i + 1:, 0])
        oy = np.minimum(a[3], boxes[i + 1:, 3]) - np.maximum(a[1], boxes[i + 1:, 1])
        for j in np.nonzero((ox > 1.0) & (oy > 1.0))[0]:
            problems.append(f"{texts[i]['text']!r} and {texts[i + 1 + j]['text']!r} overlap")
    return problems


def _to_numpy(values, name: str, ndim: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Convert a list, array or torch tensor to a float64 NumPy array, checking its number of dimensions."""
    if hasattr(values, "detach"):                      # torch tensor, without importing torch here
        values = values.detach().to("cpu").float().numpy()
    array = np.asarray(values, dtype=np.float64)
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if allowed is not None and array.ndim not in allowed:
        raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimension(s), "
                         f"got shape {tuple(array.shape)}")
    return array


def _as_token_head(scales, name: str) -> np.ndarray:
    """Scales as a [tokens, heads] matrix; [blocks, block_size, heads] views are flattened block by block."""
    array = _to_numpy(scales, name, ndim=(1, 2, 3))
    if array.ndim == 1:
        return array[:, None]
    if array.ndim == 3:
        return array.reshape(-1, array.shape[-1])
    return array


# ---- quantized KV cache ------------------------------------------------------------------------------------

def scale_heatmap(scales_before, scales_after, title: str = "Per-(token, head) scales",
                  labels: tuple[str, str] = ("before", "after")) -> Figure:
    """Side-by-side heatmaps of inline scales, log colour scale shared by both panels.

    `scales_before` and `scales_after` are [tokens, kv_heads] (or the [blocks, block_size, kv_heads] scale views,
    flattened block by block). A wipe to 1.0 shows as a bright band among the ~1e-2 scales; values <= 0 (never
    written, or zero-filled storage) are drawn grey.
    """
    before = _as_token_head(scales_before, "scales_before")
    after = _as_token_head(scales_after, "scales_after")
    if before.shape != after.shape:
        raise ValueError(f"scales_before {before.shape} and scales_after {after.shape} must have the same shape")
    positive = np.concatenate([before[before > 0], after[after > 0]])
    vmin, vmax = (positive.min(), positive.max()) if positive.size else (1e-3, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin / 2, vmax * 2
    norm = LogNorm(vmin=vmin, vmax=vmax)
    cmap = plt.get_cmap("viridis").with_extremes(bad=EMPTY)

    fig, axes = _new_figure(1, 2, figsize=(8.0, 4.5), sharey=True)
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
    """Per-token max |K| of a clean and a damaged dequantization, log y, with the median inflation in the title.

    `clean_k` and `wiped_k` are [tokens, ...] (e.g. [tokens, kv_heads, head_size]); every trailing dimension is
    reduced with max |.|.
    """
    clean = _to_numpy(clean_k, "clean_k")
    wiped = _to_numpy(wiped_k, "wiped_k")
    if clean.shape != wiped.shape or clean.ndim < 1:
        raise ValueError(f"clean_k {clean.shape} and wiped_k {wiped.shape} must have the same, non-scalar shape")
    clean_mag = np.abs(clean.reshape(clean.shape[0], -1)).max(axis=1)
    wiped_mag = np.abs(wiped.reshape(wiped.shape[0], -1)).max(axis=1)
    ok = clean_mag > 0
    inflation = float(np.median(wiped_mag[ok] / clean_mag[ok])) if ok.any() else float("nan")

    fig, ax = _new_figure()
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
    """Requests laid out as batches (rows) x batch slots (columns), green when right and red when wrong.

    Request i is drawn in row i // max_num_seqs, which is the batch it lands in when all requests are submitted
    at once and each batch takes the next `max_num_seqs` waiting requests.
    """
    if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be a positive int, got {max_num_seqs!r}")
    flags = [bool(d) for d in damaged]
    if not flags:
        raise ValueError("damaged must list at least one request")
    rows = math.ceil(len(flags) / max_num_seqs)
    grid = np.full((rows, max_num_seqs), -1.0)
    for i, bad in enumerate(flags):
        grid[i // max_num_seqs, i % max_num_seqs] = 1.0 if bad else 0.0

    fig, ax = _new_figure(figsize=(max(4.0, 0.55 * max_num_seqs + 2), max(2.0, 0.4 * rows + 1.2)))
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
    """The bytes of one cache block, one slot and one row, from a KVLayout.

    Three bars, top to bottom: a block (K half then V half), a slot (one row per KV head), and a row
    (`head_size` codes, then the inline fp32 scale for the per-token-head formats). Byte offsets are marked.
    """
    needed = ("kv_cache_dtype", "head_size", "elem_bytes", "row_bytes", "slot_bytes", "kv_bytes", "block_bytes",
              "num_kv_heads", "block_size", "scale_offset")
    missing = [a for a in needed if not hasattr(layout, a)]
    if missing:
        raise TypeError(f"row_layout_diagram needs a KVLayout (missing attributes: {', '.join(missing)})")

    fig, axes = _new_figure(3, 1, figsize=(8.0, 4.2))
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
    """Mean (bar) and max (dot) absolute error for each format, log y; zero errors are shown as "0".

    `errors_by_format` maps a format name to its absolute errors (any shape, or a single number).
    """
    if not errors_by_format:
        raise ValueError("errors_by_format must name at least one format")
    names = list(errors_by_format)
    errors = [np.abs(_to_numpy(errors_by_format[n], f"errors_by_format[{n!r}]")).ravel() for n in names]
    means = np.array([e.mean() if e.size else 0.0 for e in errors])
    maxes = np.array([e.max() if e.size else 0.0 for e in errors])
    positive = np.concatenate([means[means > 0], maxes[maxes > 0]])
    floor = positive.min() / 10 if positive.size else 1e-12

    fig, ax = _new_figure(figsize=(min(MAX_WIDTH_IN, max(5.0, 1.5 * len(names) + 1)), 4.0))
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


# ---- paged KV cache -------------------------------------------------------------------------------------------

def _tables(block_tables) -> list[tuple[str, list[int]]]:
    if isinstance(block_tables, Mapping):
        items = list(block_tables.items())
    else:
        if hasattr(block_tables, "tolist"):
            block_tables = block_tables.tolist()
        items = [(f"seq {i}", row) for i, row in enumerate(block_tables)]
    return [(str(name), [int(b) for b in row if int(b) >= 0]) for name, row in items]


def block_table_diagram(block_tables, num_blocks: int, title: str = "Block tables and physical blocks") -> Figure:
    """Each sequence's block table (logical blocks, top rows) mapped onto the physical blocks (bottom row).

    `block_tables` is a list of lists (or a dict name -> list, or a 2-D tensor) of physical block ids; negative
    ids are padding and are skipped. A physical block referenced by several tables (a shared prefix) is drawn
    hatched and labelled with its reference count.
    """
    tables = _tables(block_tables)
    if not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
    for name, row in tables:
        if any(b >= num_blocks for b in row):
            raise ValueError(f"{name} references block {max(row)} but there are only {num_blocks} blocks")
    refcount = np.zeros(num_blocks, dtype=int)
    for _, row in tables:
        for b in set(row):
            refcount[b] += 1

    width = max(num_blocks, max((len(r) for _, r in tables), default=1))
    fig, ax = _new_figure(figsize=(min(MAX_WIDTH_IN, max(6.0, 0.45 * width + 2.2)), 1.5 + 0.6 * (len(tables) + 2)))
    colours = {name: POOL_COLOURS[i % len(POOL_COLOURS)] for i, (name, _) in enumerate(tables)}
    top = len(tables) + 1
    for i, (name, row) in enumerate(tables):
        y = top - i
        ax.text(-0.7, y + 0.4, name, ha="right", va="center", fontsize=8)
        for j, block in enumerate(row):
            ax.add_patch(Rectangle((j, y), 0.9, 0.8, facecolor=colours[name], edgecolor="black", linewidth=0.5))
            ax.text(j + 0.45, y + 0.4, str(block), ha="center", va="center", color="white", fontsize=FONT)
            ax.annotate("", xy=(block + 0.45, 0.8), xytext=(j + 0.45, y),
                        arrowprops={"arrowstyle": "->", "color": colours[name], "alpha": 0.5, "linewidth": 0.7})
    owner = {}
    for name, row in tables:
        for b in row:
            owner.setdefault(b, name)
    for b in range(num_blocks):
        shared = refcount[b] > 1
        face = colours[owner[b]] if b in owner else EMPTY
        ax.add_patch(Rectangle((b, 0), 0.9, 0.8, facecolor=face, edgecolor="black", linewidth=0.5,
                               hatch="//" if shared else None))
        ax.text(b + 0.45, -0.3, str(b), ha="center", va="center", fontsize=FONT)
        if shared:
            ax.text(b + 0.45, 0.4, f"{refcount[b]}", ha="center", va="center", fontsize=FONT,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    ax.text(-0.7, 0.4, "physical\nblocks", ha="right", va="center", fontsize=8)
    ax.set_xlim(-3.2, width + 0.2)
    ax.set_ylim(-0.7, top + 1)
    ax.axis("off")
    used = int((refcount > 0).sum())
    shared = int((refcount > 1).sum())
    ax.set_title(f"{title}: {used} of {num_blocks} blocks used, {shared} shared")
    key = "rows: each table's entries in token order, arrows to the physical block they name"
    if shared:
        key += "\nhatched: a shared block, labelled with its reference count"
    ax.text(0.5, -0.02, key, transform=ax.transAxes, ha="center", va="top", fontsize=FONT)
    return fig


def slot_mapping_diagram(slot_mapping, block_size: int, token_labels: Sequence[str] | None = None,
                         title: str = "Slot mapping", requests: Sequence[int] | None = None,
                         key: str | None = None) -> Figure:
    """Where each new token is written: a grid of cache blocks (rows) x offsets in the block (columns).

    `slot_mapping[i]` is token i's slot (block * block_size + offset); -1 means "do not write" (padding or the
    warmup step) and is counted in the title instead of drawn. Cells show `token_labels[i]` (default: i). With
    `requests` (the request of each token) every cell takes its request's colour, each row is labelled with the
    request(s) owning the block, and a legend names the colours; `key` is a line under the grid that explains the
    labels (e.g. "B: the BOS token").
    """
    slots = [int(s) for s in (slot_mapping.tolist() if hasattr(slot_mapping, "tolist") else slot_mapping)]
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if token_labels is not None and len(token_labels) != len(slots):
        raise ValueError(f"token_labels has {len(token_labels)} entries for {len(slots)} slots")
    if requests is not None and len(requests) != len(slots):
        raise ValueError(f"requests has {len(requests)} entries for {len(slots)} slots")
    labels = [str(t) for t in token_labels] if token_labels is not None else [str(i) for i in range(len(slots))]
    written = [(i, s) for i, s in enumerate(slots) if s >= 0]
    blocks = sorted({s // block_size for _, s in written})
    row_of = {b: r for r, b in enumerate(blocks)}
    owners: dict[int, list[int]] = {}
    if requests is not None:
        for i, s in written:
            owners.setdefault(s // block_size, [])
            if int(requests[i]) not in owners[s // block_size]:
                owners[s // block_size].append(int(requests[i]))

    fig, ax = _new_figure(figsize=(min(MAX_WIDTH_IN, 0.38 * block_size + 2.2), 1.7 + 0.42 * max(1, len(blocks))))
    for r, block in enumerate(blocks):
        for offset in range(block_size):
            ax.add_patch(Rectangle((offset, r), 0.95, 0.9, facecolor=EMPTY, edgecolor="white"))
        owner = owners.get(block)
        row_label = f"block {block}" + (f" · request {', '.join(map(str, owner))}" if owner else "")
        ax.text(-0.3, r + 0.45, row_label, ha="right", va="center", fontsize=FONT)
    for i, slot in written:
        r, offset = row_of[slot // block_size], slot % block_size
        colour = POOL_COLOURS[int(requests[i]) % len(POOL_COLOURS)] if requests is not None else POOL_COLOURS[0]
        ax.add_patch(Rectangle((offset, r), 0.95, 0.9, facecolor=colour, edgecolor="white"))
        ax.text(offset + 0.47, r + 0.45, labels[i], ha="center", va="center", color="white", fontsize=FONT + 1)
    ax.set_xlim(-0.1, block_size)
    ax.set_ylim(max(1, len(blocks)), -0.2)
    ax.set_xticks(np.arange(block_size) + 0.47, [str(o) for o in range(block_size)], fontsize=FONT)
    ax.set_yticks([])
    ax.set_xlabel("offset in block")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    skipped = len(slots) - len(written)
    ax.set_title(f"{title}: {len(written)} token(s) written" + (f", {skipped} with slot -1 (not written)"
                                                             if skipped else ""), fontsize=10)
    if requests is not None:
        shown = sorted({int(r) for r in requests})
        ax.legend(handles=[Patch(color=POOL_COLOURS[r % len(POOL_COLOURS)], label=f"request {r}") for r in shown],
                  loc="upper center", bbox_to_anchor=(0.5, -0.32 if key else -0.22), ncols=len(shown),
                  fontsize=FONT, frameon=False)
    if key:
        ax.text(0.5, -0.2, key, transform=ax.transAxes, ha="center", va="top", fontsize=FONT)
    return fig


def layer_pool_diagram(kv_owner: Mapping[int, int], layer_types: Sequence[str] | None = None,
                       title: str = "Which pool each layer reads and writes") -> Figure:
    """Layers (left) and the KV pools of the arena (right): an arrow from each layer to the pool its cache tensor is.

    `kv_owner[layer]` is the layer whose pool it uses (itself for a layer that owns its KV). A KV-owning layer's
    arrow is solid (it writes and reads its pool); a KV-sharing layer's is dashed (it only reads its target's).
    `layer_types` (e.g. "sliding_attention") labels each layer and colours the pools by type."""
    layers = sorted(int(layer) for layer in kv_owner)
    if not layers:
        raise ValueError("kv_owner is empty: pass {layer: the layer whose pool it uses}")
    pools = sorted({int(kv_owner[layer]) for layer in layers})
    for layer in layers:
        if kv_owner[layer] != layer and kv_owner[kv_owner[layer]] != kv_owner[layer]:
            raise ValueError(f"layer {layer} shares layer {kv_owner[layer]}'s pool, which is not a KV-owning layer")
    kinds = [t.split("_")[0] for t in layer_types] if layer_types is not None else None
    kind_colour = {k: POOL_COLOURS[i % len(POOL_COLOURS)] for i, k in enumerate(dict.fromkeys(kinds or ["pool"]))}
    fig, ax = _new_figure(figsize=(6.4, 0.5 * len(layers) + 1.6))
    for row, layer in enumerate(layers):
        owner = kv_owner[layer]
        label = f"layer {layer}" + (f" ({kinds[layer]})" if kinds else "")
        ax.add_patch(Rectangle((0, -row - 0.4), 2.6, 0.8, facecolor=EMPTY if owner != layer else "white",
                               edgecolor=NEUTRAL, linewidth=0.8))
        ax.text(1.3, -row, label, ha="center", va="center", fontsize=FONT + 1)
        target_row = pools.index(owner) * (len(layers) - 1) / max(1, len(pools) - 1)
        ax.annotate("", xy=(4.4, -target_row), xytext=(2.6, -row),
                    arrowprops={"arrowstyle": "->", "color": NEUTRAL if owner == layer else GUARD,
                                "linestyle": "-" if owner == layer else "--", "linewidth": 1.2})
    for i, owner in enumerate(pools):
        y = -i * (len(layers) - 1) / max(1, len(pools) - 1)
        colour = kind_colour[kinds[owner]] if kinds else POOL_COLOURS[0]
        readers = [layer for layer in layers if kv_owner[layer] == owner and layer != owner]
        ax.add_patch(Rectangle((4.4, y - 0.4), 2.8, 0.8, facecolor=colour, edgecolor="white"))
        ax.text(5.8, y, f"pool of layer {owner}", ha="center", va="center", color="white", fontsize=FONT + 1)
        ax.text(7.3, y, f"also read by {', '.join(map(str, readers))}" if readers else "its owner only",
                ha="left", va="center", fontsize=FONT)
    ax.set_xlim(-0.1, 9.6)
    ax.set_ylim(-len(layers) + 0.3, 0.9)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    handles = [Line2D([0], [0], color=NEUTRAL, label="owns its pool: writes and reads it"),
               Line2D([0], [0], color=GUARD, linestyle="--", label="KV sharing: reads another layer's pool")]
    handles += [Patch(color=c, label=f"{k} attention pool") for k, c in kind_colour.items()] if kinds else []
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=2, fontsize=FONT,
              frameon=False)
    return fig


def fragmentation_plot(seq_lens: Sequence[int], block_size: int, max_seq_len: int,
                       title: str = "KV memory per sequence: contiguous vs paged") -> Figure:
    """Tokens reserved per sequence by a contiguous max-length cache and by a paged cache, against tokens used.

    A contiguous cache reserves `max_seq_len` slots per sequence; a paged cache reserves whole blocks, so it
    wastes less than one block per sequence. Waste totals are given in the title.
    """
    lens = [int(n) for n in seq_lens]
    if not lens:
        raise ValueError("seq_lens must list at least one sequence")
    if block_size < 1 or max_seq_len < max(lens) or min(lens) < 0:
        raise ValueError(f"need block_size >= 1 and 0 <= every length <= max_seq_len ({max_seq_len}), got "
                         f"block_size={block_size}, seq_lens={lens}")
    used = np.array(lens)
    paged = np.array([math.ceil(n / block_size) * block_size for n in lens])
    contiguous = np.full(len(lens), max_seq_len)

    fig, ax = _new_figure(figsize=(min(MAX_WIDTH_IN, max(5.0, 0.4 * len(lens) + 1.6)), 4.2))
    x = np.arange(len(lens))
    ax.bar(x - 0.2, contiguous, 0.4, color=EMPTY, edgecolor=GUARD, label="contiguous: reserved")
    ax.bar(x + 0.2, paged, 0.4, color=POOL_COLOURS[1], label="paged: reserved")
    for offset in (-0.2, 0.2):
        ax.bar(x + offset, used, 0.4, color=POOL_COLOURS[0], label="used" if offset < 0 else None)
    ax.set_xticks(x, [str(i) for i in x], fontsize=FONT)
    ax.set_xlabel("request")
    ax.set_ylabel("token slots")
    ax.set_ylim(0, max_seq_len * 1.22)
    waste_c = int((contiguous - used).sum())
    waste_p = int((paged - used).sum())
    ax.set_title(f"{title}\nwasted slots: contiguous {waste_c}, paged {waste_p}", fontsize=10)
    ax.legend(fontsize=FONT, loc="upper center", ncols=3, frameon=False)
    return fig


def pool_byte_map(regions: Sequence[tuple[str, str, int, int]], blocks_correct: Sequence[tuple[int, int]],
                  blocks_doubled: Sequence[tuple[int, int]], pool: str | None = None,
                  title: str = "KV arena byte map") -> Figure:
    """The arena as a horizontal byte bar, and where each block lands with the correct and the doubled stride.

    `regions` is `KVArena.byte_map()`: [(kind, name, start, end)] with kind "pool" or "guard". `blocks_correct`
    and `blocks_doubled` are [(start, end)] arena byte ranges of the same blocks addressed both ways. A block is
    drawn green when it lies inside `pool` (or, with `pool=None`, touches no guard zone) and red otherwise.
    """
    regions = [(str(k), str(n), int(s), int(e)) for k, n, s, e in regions]
    if not regions:
        raise ValueError("regions is empty: pass KVArena.byte_map()")
    if any(k not in ("pool", "guard") for k, *_ in regions):
        raise ValueError("each region's kind must be 'pool' or 'guard'")
    pools = {n: (s, e) for k, n, s, e in regions if k == "pool"}
    if pool is not None and pool not in pools:
        raise ValueError(f"unknown pool {pool!r}; the arena has {sorted(pools)}")
    guards = [(s, e) for k, _, s, e in regions if k == "guard"]

    def inside(start: int, end: int) -> bool:
        if pool is not None:
            lo, hi = pools[pool]
            return lo <= start and end <= hi
        return not any(start < ge and gs < end for gs, ge in guards)

    total = max(e for *_, e in regions)
    fig, ax = _new_figure(figsize=(MAX_WIDTH_IN, 3.2))
    pool_colour = {}
    for kind, name, start, end in regions:
        if kind == "pool":
            pool_colour[name] = POOL_COLOURS[len(pool_colour) % len(POOL_COLOURS)]
            ax.add_patch(Rectangle((start, 2), end - start, 0.8, facecolor=pool_colour[name], edgecolor="white"))
            if _text_fits(ax, name, end - start, total):
                ax.text((start + end) / 2, 2.4, name, ha="center", va="center", color="white", fontsize=FONT)
        else:
            ax.add_patch(Rectangle((start, 2), end - start, 0.8, facecolor="white", edgecolor=GUARD, hatch="xx",
                                   linewidth=0.5))
    rows = (("correct stride", blocks_correct, 1.0), ("doubled stride", blocks_doubled, 0.0))
    outside_counts = []
    for label, blocks, y in rows:
        outside = 0
        for start, end in blocks:
            ok = inside(int(start), int(end))
            outside += not ok
            ax.add_patch(Rectangle((start, y), max(end - start, total / 400), 0.7, facecolor=RIGHT if ok else WRONG,
                                   edgecolor="black", linewidth=0.3))
        ax.text(-total * 0.01, y + 0.35, label, ha="right", va="center", fontsize=8)
        outside_counts.append(f"{label}: {outside} of {len(blocks)} outside")
    ax.text(-total * 0.01, 2.4, "arena", ha="right", va="center", fontsize=8)
    ax.set_xlim(0, total)
    ax.set_ylim(-0.2, 3.0)
    ax.set_yticks([])
    ax.set_xlabel("arena byte offset")
    ax.legend(handles=[Patch(facecolor="white", edgecolor=GUARD, hatch="xx", label="guard zone"),
                       Patch(color=RIGHT, label="block inside" + (f" {pool}" if pool else " a pool")),
                       Patch(color=WRONG, label="block outside")],
              loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8, frameon=False)
    ax.set_title(f"{title}\n" + "; ".join(outside_counts), fontsize=10)
    return fig


# ---- performance ----------------------------------------------------------------------------------------------

def bandwidth_plot(rows: Sequence, copy_gbps: float, title: str = "Achieved memory bandwidth") -> Figure:
    """Horizontal bars of GB/s per measurement, with a dashed line at a plain device copy's GB/s for reference.

    Each row is a mapping with "label" and "gbps" keys (extra keys ignored) or a (label, gbps) pair.
    """
    items = []
    for row in rows:
        if isinstance(row, Mapping):
            if "label" not in row or "gbps" not in row:
                raise ValueError(f"a bandwidth row needs 'label' and 'gbps' keys, got {sorted(row)}")
            items.append((str(row["label"]), float(row["gbps"])))
        else:
            label, gbps = row
            items.append((str(label), float(gbps)))
    if not items:
        raise ValueError("rows must hold at least one measurement")
    if not copy_gbps > 0:
        raise ValueError(f"copy_gbps must be positive, got {copy_gbps}")

    fig, ax = _new_figure(figsize=(7.5, 1.2 + 0.35 * len(items)))
    y = np.arange(len(items))
    values = [g for _, g in items]
    ax.barh(y, values, color=POOL_COLOURS[0])
    for yi, g in zip(y, values):
        ax.text(g, yi, f" {g:.0f} ({100 * g / copy_gbps:.0f}%)", va="center", fontsize=FONT)
    ax.axvline(copy_gbps, color=NEUTRAL, linestyle="--", label=f"device copy: {copy_gbps:.0f} GB/s")
    ax.set_yticks(y, [label for label, _ in items], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(max(values), copy_gbps) * 1.25)
    ax.set_xlabel("GB/s")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return fig

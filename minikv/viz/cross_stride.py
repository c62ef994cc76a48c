"""The figures (and the code-site diff) of defect B, cross-attention stride doubling and the FP8 context read.
See docs/internals.md#viz-cross-stride."""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from .style import (
    DPI,
    EMPTY,
    FONT,
    GUARD,
    MAX_WIDTH_IN,
    NEUTRAL,
    POOL_COLOURS,
    RIGHT,
    WRONG,
    new_figure,
    to_numpy,
)

KB = 1024


def _short(name: str) -> str:
    """'cross.decoder.1.cross_attn' / 'decoder.1.cross_attn' -> 'cross 1'; '...0.self_attn' -> 'self 0'."""
    parts = name.split(".")
    if "decoder" in parts and parts.index("decoder") + 1 < len(parts):
        return f"{'cross' if parts[-1].startswith('cross') else 'self'} {parts[parts.index('decoder') + 1]}"
    return name


def _check_panel(panel: Mapping) -> None:
    missing = {"title", "regions", "doubled", "self_blocks"} - set(panel)
    if missing:
        raise ValueError(f"each panel needs the keys title, regions, doubled, self_blocks; missing {sorted(missing)} "
                         "(build it with minikv.repro.cross_stride.byte_arrangement)")
    if any(r[0] not in ("pool", "guard") for r in panel["regions"]):
        raise ValueError("each region's kind must be 'pool' or 'guard' (pass KVArena.byte_map())")


def _fits(ax, text: str, width_data: float, fontsize: float = FONT) -> bool:
    """Whether `text` at `fontsize` fits into `width_data` x-units of `ax` (estimated from the figure's size)."""
    fig = ax.figure
    x0, x1 = ax.get_xlim()
    axes_px = ax.get_position().width * fig.get_figwidth() * fig.dpi
    px = width_data / max(x1 - x0, 1e-9) * axes_px
    return px >= 0.62 * fontsize * fig.dpi / 72 * len(text) + 2


def landing_segments(start: int, end: int, own: str, regions: Sequence) -> list[tuple[int, int, str]]:
    """Split the bytes [start, end) of one block of pool `own` by the arena region they land in:
    [(start, end, where)], where is "own" (its own pool), "guard" (a guard zone: it holds no layer's data, so a
    landing there damages nothing) or "live" (another layer's pool: a landing there overwrites live data)."""
    segments = []
    for kind, name, lo, hi in regions:
        a, b = max(start, lo), min(end, hi)
        if a < b:
            segments.append((a, b, "guard" if kind == "guard" else "own" if name == own else "live"))
    return segments


# How a block's bytes are drawn, by where they land (see `landing_segments`).
LANDING_STYLE = {
    "own": {"facecolor": RIGHT, "edgecolor": "white", "linewidth": 0.6},
    "guard": {"facecolor": "white", "edgecolor": RIGHT, "hatch": "....", "linewidth": 0.8},
    "live": {"facecolor": WRONG, "edgecolor": "white", "linewidth": 0.6},
}
LANDING_LABEL = {"own": "block bytes in its own pool",
                 "guard": "block bytes in a guard zone (no data there: harmless)",
                 "live": "block bytes in another layer's live pool (damaging)"}


def stride_byte_map(panels: Sequence[Mapping], x_max: int | None = None,
                    title: str = "Historical cross stride: where every cross layer's blocks land") -> Figure:
    """One panel per pool factor, all on the same arena-byte axis (KiB)."""
    if not panels:
        raise ValueError("panels is empty: pass one arrangement per pool factor")
    for p in panels:
        _check_panel(p)
    cross_names = list(panels[0]["doubled"])
    if x_max is None:
        x_max = max(max([e for blocks in p["doubled"].values() for _, e, _ in blocks] or [0]) for p in panels)
        x_max = int(x_max * 1.04) + 4 * KB
    rows = len(cross_names) + 2
    fig, axes = new_figure(len(panels), 1, figsize=(MAX_WIDTH_IN, 1.5 + 0.36 * rows * len(panels)), sharex=True)
    axes = np.atleast_1d(axes)
    colour = {}
    for ax, p in zip(axes, panels):
        ax.set_xlim(0, x_max / KB)
        ax.set_ylim(-0.1, rows)
        y_arena = rows - 1
        for kind, name, start, end in p["regions"]:
            if start >= x_max:
                continue
            shown_end = min(end, x_max)
            if kind == "pool":
                colour.setdefault(name, POOL_COLOURS[len(colour) % len(POOL_COLOURS)])
                ax.add_patch(Rectangle((start / KB, y_arena), (shown_end - start) / KB, 0.8, facecolor=colour[name],
                                       edgecolor="white"))
                label = _short(name) + (" →" if end > x_max else "")
                if _fits(ax, label, (shown_end - start) / KB):
                    ax.text((start + shown_end) / 2 / KB, y_arena + 0.4, label, ha="center", va="center",
                            color="white", fontsize=FONT)
            else:
                ax.add_patch(Rectangle((start / KB, y_arena), (shown_end - start) / KB, 0.8, facecolor="white",
                                       edgecolor=GUARD, hatch="xxx", linewidth=0.5))
        written = []           # (start, end) of every byte range a doubled write put into another layer's live pool
        for i, name in enumerate(cross_names):
            y = y_arena - 1 - i
            for start, end, req in p["doubled"][name]:
                for a, b, where in landing_segments(start, end, name, p["regions"]):
                    if where == "live":
                        written.append((a, b))
                    ax.add_patch(Rectangle((a / KB, y + 0.05), (b - a) / KB, 0.7, **LANDING_STYLE[where]))
                if _fits(ax, f"r{req}", (end - start) / KB):
                    ax.text((start + end) / 2 / KB, y + 0.4, f"r{req}", ha="center", va="center", color="white",
                            fontsize=FONT, bbox={"boxstyle": "square,pad=0.05", "facecolor": NEUTRAL,
                                                 "edgecolor": "none", "alpha": 0.55})
            ax.text(-0.01, y + 0.4, f"{_short(name)} at 2x", transform=ax.get_yaxis_transform(), ha="right",
                    va="center", fontsize=FONT)
        shown = [(s, e, r) for s, e, r in p["self_blocks"] if s < x_max]
        hit_requests = []
        for start, end, req in shown:
            hit = any(s < end and start < e for s, e in written)
            if hit and req not in hit_requests:
                hit_requests.append(req)
            ax.add_patch(Rectangle((start / KB, 0.05), (min(end, x_max) - start) / KB, 0.7, facecolor=EMPTY,
                                   edgecolor=WRONG if hit else NEUTRAL, linewidth=1.6 if hit else 0.4))
        if shown:
            requests = sorted({r for *_, r in shown})
            note = f"blocks of r{requests[0]}-r{requests[-1]}" + (
                f"; under a stray write: {', '.join(f'r{r}' for r in sorted(hit_requests))}" if hit_requests else "")
            first = min(s for s, _, _ in shown)
            right = max(min(e, x_max) for _, e, _ in shown)
            if _fits(ax, note, x_max / KB - right / KB - 2):
                ax.text(right / KB + 1, 0.4, note, ha="left", va="center", fontsize=FONT,
                        color=WRONG if hit_requests else NEUTRAL)
            else:
                ax.text(first / KB - 1, 0.4, note, ha="right", va="center", fontsize=FONT,
                        color=WRONG if hit_requests else NEUTRAL)
        ax.text(-0.01, 0.4, "self-attn", transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=FONT)
        ax.text(-0.01, y_arena + 0.4, "arena", transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=FONT)
        wrong = p.get("wrong")
        label = p["title"] + ("" if wrong is None else
                              f"; wrong requests: {', '.join(map(str, wrong)) if wrong else 'none'}")
        ax.set_title(label, fontsize=FONT + 1, loc="left")
        ax.set_yticks([])
        ax.tick_params(labelsize=FONT)
    axes[-1].set_xlabel("arena byte offset (KiB); rN: request N", fontsize=FONT + 1)
    fig.legend(handles=[Patch(facecolor="white", edgecolor=GUARD, hatch="xxx", label="guard zone of the arena"),
                        *(Patch(**LANDING_STYLE[w], label=LANDING_LABEL[w]) for w in ("own", "guard", "live")),
                        Patch(facecolor=EMPTY, edgecolor=WRONG, label="self-attn block under a stray write")],
               loc="outside lower center", ncols=2, fontsize=FONT, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def _plain(value: float, _pos=None) -> str:
    """Tick labels of a symlog axis as plain numbers (-10, -1, 0, 1, 10), not powers such as '−10⁰'."""
    return f"{value:g}".replace("-", "−")


def fp8_row_as_16bit(row_bytes, fp8_values, read_values, title: str = "One FP8 K row, read as 16-bit") -> Figure:
    """One FP8 row's bytes as a 16-bit reader decodes them."""
    raw = to_numpy(row_bytes, "row_bytes", ndim=1).astype(np.int64)
    want = to_numpy(fp8_values, "fp8_values", ndim=1)
    got = to_numpy(read_values, "read_values", ndim=1)
    n = want.shape[0]
    if raw.shape[0] != 2 * n or got.shape[0] != n:
        raise ValueError(f"row_bytes must hold 2 x head_size bytes and read_values head_size values; got "
                         f"{raw.shape[0]} bytes, {n} FP8 values, {got.shape[0]} read values")
    fig, (top, bottom) = new_figure(2, 1, figsize=(MAX_WIDTH_IN, 6.2), height_ratios=(1.3, 2.0))
    bad = ~(np.isfinite(got) & (got == want))
    for line in range(2):
        y = 3.2 - 2.1 * line
        for i in range(n):
            b = line * n + i
            mine = b < n
            top.add_patch(Rectangle((i, y), 1, 0.8, facecolor=POOL_COLOURS[0] if mine else EMPTY,
                                    edgecolor="white", linewidth=0.5))
            top.text(i + 0.5, y + 0.4, f"{raw[b]:02x}", ha="center", va="center", fontsize=FONT,
                     color="white" if mine else NEUTRAL)
        for k in range(n // 2):
            j = line * (n // 2) + k
            top.add_patch(Rectangle((2 * k, y - 0.9), 2, 0.8, facecolor=WRONG if bad[j] else RIGHT,
                                    edgecolor="white", linewidth=0.8))
            top.text(2 * k + 1, y - 0.5, str(j), ha="center", va="center", fontsize=FONT, color="white")
        top.text(-0.3, y + 0.4, "bytes", ha="right", va="center", fontsize=FONT)
        top.text(-0.3, y - 0.5, "16-bit", ha="right", va="center", fontsize=FONT)
    top.text(0, 4.15, f"bytes 0-{n - 1}: the FP8 row, {n} elements of 1 byte (hex)", ha="left", fontsize=FONT)
    top.text(0, 2.05, f"bytes {n}-{2 * n - 1}: the next row's bytes, which the 16-bit reader also takes",
             ha="left", fontsize=FONT, color=NEUTRAL)
    top.set_xlim(-0.2, n + 0.2)
    top.set_ylim(0.0, 4.6)
    top.axis("off")
    finite = got[np.isfinite(got)]
    span = max(np.abs(want).max(), np.abs(finite).max() if finite.size else 1.0, 1e-3) * 1.15
    shown = np.where(np.isfinite(got), got, np.sign(np.nan_to_num(got, nan=1.0)) * span)
    x = np.arange(n)
    bottom.axhline(0, color=NEUTRAL, linewidth=0.5)
    bottom.scatter(x, want, color=RIGHT, s=22, label="element as the FP8 cache holds it", zorder=3)
    bottom.scatter(x[bad], shown[bad], color=WRONG, marker="x", s=28, label="as the 16-bit reader decodes it",
                   zorder=4)
    bottom.scatter(x[~bad], shown[~bad], color=RIGHT, marker="x", s=28, zorder=4)
    for j in range(n):
        bottom.plot([j, j], [want[j], shown[j]], color=WRONG if bad[j] else RIGHT, linewidth=0.5, alpha=0.6)
    linthresh = max(np.abs(want).max() / 4, 1e-3)
    bottom.set_yscale("symlog", linthresh=linthresh)
    # Inside the linear zone the decade ticks crowd together: label 0 and the ticks outside it only.
    bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "" if 0 < abs(v) < linthresh else _plain(v)))
    bottom.set_xlabel("element of the row (head dimension)", fontsize=FONT + 1)
    bottom.set_ylabel("value (symmetric log scale)", fontsize=FONT + 1)
    bottom.tick_params(labelsize=FONT)
    bottom.set_ylim(-span * 4, span * 8)
    bottom.legend(fontsize=FONT, loc="upper left", ncols=2)
    bottom.set_title(f"{int(bad.sum())} of {n} elements decoded wrong", fontsize=FONT + 1)
    fig.suptitle(title, fontsize=10)
    return fig


def output_scatter(samples: Mapping[str, object], tolerance: float = 0.02,
                   title: str = "Cross-attention output at the context step vs exact") -> Figure:
    """One panel per version: every output element at the context step against the exact one."""
    if not samples:
        raise ValueError("samples is empty: pass {version: [(exact, got), ...]}")
    fig, axes = new_figure(1, len(samples), figsize=(MAX_WIDTH_IN, 3.6))
    axes = np.atleast_1d(axes)
    for ax, (label, pairs) in zip(axes, samples.items()):
        arr = to_numpy(pairs, f"samples[{label!r}]", ndim=2)
        if arr.shape[1] != 2:
            raise ValueError(f"samples[{label!r}] must be (exact, got) pairs, got shape {arr.shape}")
        exact, got = arr[:, 0], arr[:, 1]
        lim = max(np.abs(exact).max(), 1e-6) * 1.3
        finite = np.isfinite(got)
        bad = ~finite | (np.abs(got - exact) > tolerance * np.abs(exact).max())
        shown = np.clip(np.where(finite, got, lim), -lim * 3, lim * 3)
        ax.plot([-lim, lim], [-lim, lim], color=NEUTRAL, linewidth=0.6)
        ax.scatter(exact[~bad], shown[~bad], s=4, color=RIGHT, label="within tolerance")
        ax.scatter(exact[bad], shown[bad], s=4, color=WRONG, label="off the exact output")
        top = max(lim, np.abs(shown).max() * 1.05)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-top, top)
        ax.set_xlabel("exact", fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT)
        ax.set_title(f"{label}\n{int(bad.sum())} of {len(exact)} elements off", fontsize=FONT + 1)
    axes[0].set_ylabel("output", fontsize=FONT + 1)
    fig.legend(handles=[Line2D([], [], marker="o", linestyle="none", color=RIGHT, label="within tolerance"),
                        Line2D([], [], marker="o", linestyle="none", color=WRONG, label="off the exact output")],
               loc="outside lower center", ncols=2, fontsize=FONT, frameon=False)
    fig.suptitle(title + f"\n(off: |out - exact| > {tolerance:g} x max|exact|)", fontsize=10)
    return fig


# ---- defect B1's picture story ------------------------------------------------------------------------------------

B_CODES = {"write": "W", "write stray": "W!", "read": "R", "read overwritten": "R!"}
B_KEY = ("W wrote its own pool  ·  W! some of its bytes landed outside its pool  ·  R read only its own bytes  ·  "
         "R! read bytes\nanother layer overwrote (which requests: below the code)")


def _b_state(events: Sequence[str]) -> int:
    if "write stray" in events or "read overwritten" in events:
        return 3
    if "read" in events:
        return 2
    return 1 if events else 0


def cross_timeline_figure(*timelines, max_columns: int = 6,
                          title: str = "Who writes and reads the arena, and when (historical cross stride)") -> Figure:
    """One panel per run: what each attention layer wrote and read, step by step."""
    if not timelines:
        raise ValueError("cross_timeline_figure needs at least one CrossTimeline")
    rows = sum(len(t.layers) + 1.8 for t in timelines)
    fig, axes = new_figure(len(timelines), 1, figsize=(MAX_WIDTH_IN, 0.36 * rows + 1.4))
    axes = np.atleast_1d(axes)
    from matplotlib.colors import ListedColormap
    cmap = ListedColormap([EMPTY, "#d9d9d9", RIGHT, WRONG])
    for ax, t in zip(axes, timelines):
        columns = t.columns[:max_columns]
        grid = np.array([[_b_state(t.events(layer, c)) for c in columns] for layer in t.layers])
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
        for i, layer in enumerate(t.layers):
            for j, c in enumerate(columns):
                text = " ".join(B_CODES[e] for e in t.events(layer, c))
                victims = t.victims.get((layer, c))
                if victims:
                    text += "\nrequests " + ",".join(map(str, victims))
                ax.text(j, i, text, ha="center", va="center", fontsize=FONT,
                        color="white" if grid[i, j] in (2, 3) else NEUTRAL)
        labels = [("context\n" if t.phases.get(c) == "prefill" else "") + c.removeprefix("step ") for c in columns]
        ax.set_xticks(range(len(columns)), labels, fontsize=FONT)
        ax.set_yticks(range(len(t.layers)), [_short(n) + "-attn" for n in t.layers], fontsize=FONT)
        ax.set_xticks(np.arange(-0.5, len(columns)), minor=True)
        ax.set_yticks(np.arange(-0.5, len(t.layers)), minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        wrong = f"; wrong requests: {', '.join(map(str, t.wrong)) if t.wrong else 'none'}"
        ax.set_title((t.title or ("buggy engine" if t.buggy else "fixed engine")) + wrong, loc="left",
                     fontsize=FONT + 1)
    axes[-1].set_xlabel("engine step (within a step the layers run top to bottom)", fontsize=FONT + 1)
    fig.legend(handles=[Patch(color="#d9d9d9", label="W: a write into its own pool"),
                        Patch(color=RIGHT, label="R: read only its own bytes"),
                        Patch(color=WRONG, label="W! or R!: a stray write, or a read of overwritten bytes")],
               loc="outside lower center", ncols=2, fontsize=FONT, frameon=False, title=B_KEY, title_fontsize=FONT)
    fig.suptitle(title, fontsize=10)
    return fig


def _token(text: str) -> str:
    return "EOS" if text == "" else text.replace(" ", "·")


def cross_causal_chain_figure(chain, title: str | None = None) -> Figure:
    """Three panels for one damaged request (`minikv.repro.cross_stride_trace.CrossCausalChain`)."""
    fig = Figure(figsize=(MAX_WIDTH_IN, 6.4), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=(1.5, 1.0, 1.0))
    ax1, ax2, ax3 = (fig.add_subplot(grid[i]) for i in range(3))
    lo = min(min(d[2] for d in chain.doubled), min(d[4] for d in chain.doubled))
    hi = max(max(d[5] for d in chain.doubled), max(e for _, _, e in chain.victim_blocks))
    ax1.set_xlim(lo / KB - 1, hi / KB + 1)
    pool_name = next((n for k, n, s, e in chain.regions if k == "pool" and s == chain.pool_start), None)
    regions = chain.regions or [("pool", pool_name or "", chain.pool_start, chain.pool_end)]
    for kind, name, start, end in regions:            # the arena row: pools, and the guard zones between them
        a, b = max(start, lo), min(end, hi)
        if a >= b:
            continue
        if kind == "pool":
            ax1.add_patch(Rectangle((a / KB, 3.0), (b - a) / KB, 0.8, facecolor=POOL_COLOURS[3] if name.startswith(
                "kv.") else POOL_COLOURS[2], edgecolor="white"))
            label = f"{_short(name)} pool" if name else "pool"
        else:
            ax1.add_patch(Rectangle((a / KB, 3.0), (b - a) / KB, 0.8, facecolor="white", edgecolor=GUARD,
                                    hatch="xxx", linewidth=0.5))
            label = "guard"
        if _fits(ax1, label, (b - a) / KB):
            ax1.text((a + b) / 2 / KB, 3.4, label, ha="center", va="center", fontsize=FONT,
                     color="white" if kind == "pool" else NEUTRAL,
                     bbox=None if kind == "pool" else {"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    own = pool_name or ""
    for _block, req, r0, r1, a0, a1 in chain.doubled:
        ax1.add_patch(Rectangle((r0 / KB, 1.6), (r1 - r0) / KB, 0.8, facecolor=RIGHT, edgecolor="white"))
        for s0, s1, where in (landing_segments(a0, a1, own, chain.regions) if chain.regions else
                              [(a0, a1, "own" if a1 <= chain.pool_end else "live")]):
            ax1.add_patch(Rectangle((s0 / KB, 0.1), (s1 - s0) / KB, 0.8, **LANDING_STYLE[where]))
        for y, (x0, x1) in ((2.0, (r0, r1)), (0.5, (a0, a1))):
            if _fits(ax1, f"r{req}", (x1 - x0) / KB):
                ax1.text((x0 + x1) / 2 / KB, y, f"r{req}", ha="center", va="center", color="white", fontsize=FONT,
                         bbox={"boxstyle": "square,pad=0.05", "facecolor": NEUTRAL, "edgecolor": "none",
                               "alpha": 0.55})
    for _block, s, e in chain.victim_blocks:
        ax1.add_patch(Rectangle((s / KB, -0.05), (e - s) / KB, 1.1, facecolor="none", edgecolor=NEUTRAL,
                                linewidth=2.0))
        ax1.text((s + e) / 2 / KB, -0.35, f"request {chain.request}'s rows in the {_short(chain.victim_layer)} pool",
                 ha="center", va="top", fontsize=FONT)
    ax1.set_ylim(-1.0, 4.0)
    ax1.set_yticks([0.5, 2.0, 3.4], ["at 2x stride", "as allocated", "arena"], fontsize=FONT)
    ax1.tick_params(axis="x", labelsize=FONT)
    ax1.set_xlabel("arena byte offset (KiB); rN: a block of request N; dotted: in a guard zone (harmless), red: in "
                   "a live pool", fontsize=FONT)
    ax1.set_title(f"1. {_short(chain.culprit)}-attn at the doubled stride ({chain.factor:g}x pool, {chain.blocks} "
                  "blocks): its highest blocks land past the pool", fontsize=FONT + 1, loc="left")

    n = len(chain.rows)
    for i, (position, k_bad, v_bad) in enumerate(chain.rows):
        for row, bad in ((0, k_bad), (1, v_bad)):
            ax2.add_patch(Rectangle((i, -row), 0.9, 0.8, facecolor=WRONG if bad else RIGHT, edgecolor="white"))
            ax2.text(i + 0.45, -row + 0.4, f"{'KV'[row]} {position}", ha="center", va="center", color="white",
                     fontsize=FONT)
    written = sum(k or v for _, k, v in chain.rows)
    ax2.set_xlim(-0.2, max(n, 8))
    ax2.set_ylim(-1.2, 1.0)
    ax2.axis("off")
    ax2.text(max(n, 1) + 0.3, -0.1, f"{written} of {n} token rows after the context step differ from the fixed "
             f"engine's:\n{_short(chain.culprit)}-attn's stray write, later in the same step, "
             f"replaced the K and V\nthat {_short(chain.victim_layer)}-attn had just written (measured on the bytes)",
             ha="left", va="center", fontsize=FONT)
    ax2.set_title(f"2. request {chain.request}'s {_short(chain.victim_layer)}-attn rows: first read back at "
                  f"{chain.first_overwritten_read[1]}", fontsize=FONT + 1, loc="left")

    m = max(len(chain.tokens_fixed), len(chain.tokens_buggy))
    for row, (label, seq) in enumerate((("fixed", chain.tokens_fixed), ("buggy", chain.tokens_buggy))):
        for i in range(m):
            text = _token(seq[i]) if i < len(seq) else ""
            colour = (RIGHT if row == 0 or i < chain.diverging else WRONG) if text else EMPTY
            ax3.add_patch(Rectangle((i, -row), 0.9, 0.8, facecolor=colour, edgecolor="white"))
            ax3.text(i + 0.45, -row + 0.4, text, ha="center", va="center", color="white", fontsize=FONT + 1)
        ax3.text(-0.2, -row + 0.4, label, ha="right", va="center", fontsize=FONT + 1)
    ax3.add_patch(Rectangle((chain.diverging - 0.05, -1.1), 1.0, 2.0, fill=False, edgecolor=NEUTRAL, linewidth=1.2))
    ax3.set_xlim(-1.4, m + 0.1)
    ax3.set_ylim(-1.3, 1.0)
    ax3.axis("off")
    reason = ("token 0 comes from the context step, where the layer read its rows before the stray write; "
              if chain.diverging >= 1 else "")
    ax3.set_title(f"3. the generated tokens: they part at token {chain.diverging} ({reason}outlined: the first "
                  "that differs)", fontsize=FONT + 1, loc="left", wrap=True)
    fig.suptitle(title or f"Request {chain.request}: doubled stride → a stray write over its "
                          f"{_short(chain.victim_layer)}-attn rows → a wrong token", fontsize=10)
    return fig


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def site_versions(source: str) -> tuple[list[str], list[str]]:
    """(historical, fixed) source lines of a function with one HISTORICAL / FIX site."""
    lines = source.splitlines()
    n = len(lines)
    try:
        i = next(i for i in range(n - 1) if lines[i].lstrip().startswith("if ")
                 and lines[i + 1].strip().startswith("# HISTORICAL"))
    except StopIteration:
        raise ValueError("no `if ...:` followed by a `# HISTORICAL` comment in this source") from None
    ind = _indent(lines[i])

    def block_end(j: int, deeper_than: int) -> int:
        while j < n and (not lines[j].strip() or _indent(lines[j]) > deeper_than):
            j += 1
        return j

    def dedent(block: list[str]) -> list[str]:
        return [line[4:] if line.strip() else line for line in block]

    j = block_end(i + 1, ind)
    historical = dedent(lines[i + 1:j])
    if j < n and lines[j].strip() == "else:" and _indent(lines[j]) == ind:
        k = block_end(j + 1, ind)
        return lines[:i] + historical + lines[k:], lines[:i] + dedent(lines[j + 1:k]) + lines[k:]
    k = block_end(j, ind - 1)
    fixed = lines[:i] + lines[j:k] + lines[k:]
    condition = lines[i].strip()[len("if "):-1].split(" and ")
    kept = [c for c in condition if "historical" not in c]    # the switch goes; a real condition stays
    if kept:
        return lines[:i] + [" " * ind + "if " + " and ".join(kept) + ":"] + lines[i + 1:], fixed
    return lines[:i] + historical + lines[k:], fixed


def code_site_diff(func) -> str:
    """The unified diff from a function's HISTORICAL version to its FIX version, both taken from its source."""
    historical, fixed = site_versions(inspect.getsource(func))
    name = getattr(func, "__qualname__", getattr(func, "__name__", "source"))
    return "\n".join(difflib.unified_diff(historical, fixed, f"{name} (HISTORICAL)", f"{name} (FIX)", lineterm="",
                                          n=max(len(historical), len(fixed))))


__all__ = [
    "code_site_diff",
    "cross_causal_chain_figure",
    "cross_timeline_figure",
    "fp8_row_as_16bit",
    "output_scatter",
    "site_versions",
    "stride_byte_map",
]

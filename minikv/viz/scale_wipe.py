"""The figures of defect A's picture story (notebook 03): who touches the shared storage when, and how a wiped
scale becomes a wrong token. See docs/internals.md#viz-scale-wipe."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .style import (
    DPI,
    EMPTY,
    FONT,
    MAX_WIDTH_IN,
    NEUTRAL,
    POOL_COLOURS,
    RIGHT,
    SCALE,
    WRONG,
    new_figure,
    to_numpy,
)

# Cell codes of the timeline: what a layer did in one column, in order.
CODES = {"write": "W", "fill": "F", "wipe": "F!", "read": "R", "read wiped": "R!"}
QUIET = "#d9d9d9"       # light grey: something happened that is neither right nor wrong (a write, a harmless fill)


def _cell_state(events: Sequence[str]) -> int:
    """0 nothing, 1 neutral (write / harmless fill only), 2 right (read of rows with their own scales), 3 wrong."""
    if "wipe" in events or "read wiped" in events:
        return 3
    if "read" in events:
        return 2
    return 1 if events else 0


def _column_labels(timeline) -> list[str]:
    labels = []
    for column in timeline.columns:
        if column == "warmup":
            labels.append("warmup")
        else:
            phase = timeline.phases.get(column, "")
            labels.append(column.removeprefix("step ") + ("\nprefill" if phase == "prefill" else ""))
    return labels


def _layer_labels(timeline) -> list[str]:
    out = []
    for layer in range(timeline.num_layers):
        owner = timeline.storages.get(layer, layer)
        out.append(f"layer {layer}" + (f" (reads {owner}'s)" if owner != layer else ""))
    return out


_STATE_CMAP = ListedColormap([EMPTY, QUIET, RIGHT, WRONG])
CODE_KEY = ("W wrote its own pool  ·  F filled the storage's scales with 1.0, wiping nothing  ·  F! filled them over "
            "written scales (the wipe)\nR read K/V with their own scales  ·  R! read rows whose scales were wiped")
_LEGEND = [Patch(color=QUIET, label="only W or F: wrote, or filled harmlessly"),
           Patch(color=RIGHT, label="R: read rows with their own scales"),
           Patch(color=WRONG, label="F! or R!: wiped, or read wiped rows")]


def timeline_figure(*timelines, title: str = "Who touches the shared storages, and when") -> Figure:
    """One panel per engine (e.g. buggy then fixed): layers (rows) x warmup and engine steps (columns)."""
    if not timelines:
        raise ValueError("timeline_figure needs at least one Timeline")
    rows = sum(t.num_layers + 1.6 for t in timelines)
    fig, axes = new_figure(len(timelines), 1, figsize=(MAX_WIDTH_IN, 0.3 * rows + 1.5))
    axes = np.atleast_1d(axes)
    for ax, t in zip(axes, timelines):
        grid = np.array([[_cell_state(t.events(layer, c)) for c in t.columns] for layer in range(t.num_layers)])
        ax.imshow(grid, cmap=_STATE_CMAP, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
        for layer in range(t.num_layers):
            for j, c in enumerate(t.columns):
                text = " ".join(CODES[e] for e in t.events(layer, c))
                ax.text(j, layer, text, ha="center", va="center", fontsize=FONT + 1,
                        color="white" if grid[layer, j] in (2, 3) else NEUTRAL)
        ax.set_xticks(range(len(t.columns)), _column_labels(t), fontsize=FONT)
        ax.set_yticks(range(t.num_layers), _layer_labels(t), fontsize=FONT)
        ax.set_xticks(np.arange(-0.5, len(t.columns)), minor=True)
        ax.set_yticks(np.arange(-0.5, t.num_layers), minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"{'buggy' if t.buggy else 'fixed'} engine", loc="left", fontsize=10)
    axes[-1].set_xlabel("engine step (within a step the layers run top to bottom)", fontsize=FONT + 1)
    fig.legend(handles=_LEGEND, loc="outside lower center", ncols=3, fontsize=FONT, frameon=False,
               title=CODE_KEY, title_fontsize=FONT)
    fig.suptitle(title)
    return fig


def wiped_reads_figure(timeline, title: str = "Which layers read wiped rows, step by step") -> Figure:
    """Layers x every step of a run: red where the layer's attention read rows whose scales were wiped, green where
    it read only rows with their own scales. Batches are marked along the top."""
    columns = [c for c in timeline.columns if c != "warmup"]
    if not columns:
        raise ValueError("the timeline has no engine step")
    grid = np.zeros((timeline.num_layers, len(columns)))
    for layer in range(timeline.num_layers):
        for j, c in enumerate(columns):
            events = timeline.events(layer, c)
            grid[layer, j] = 3 if "read wiped" in events else 2 if "read" in events else 0
    fig, ax = new_figure(figsize=(MAX_WIDTH_IN, 3.4))
    ax.imshow(grid, cmap=_STATE_CMAP, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(timeline.num_layers), _layer_labels(timeline), fontsize=FONT)
    starts = [j for j, c in enumerate(columns) if timeline.phases.get(c) == "prefill"]
    for j in starts:
        ax.axvline(j - 0.5, color="white", linewidth=1.5)
    ax.set_xticks(starts, [columns[j].removeprefix("step ") for j in starts], fontsize=FONT)
    ax.set_xlabel("engine step (white lines: a prefill step, where a new batch starts)", fontsize=FONT + 1)
    ax.legend(handles=[Patch(color=RIGHT, label="read own scales"), Patch(color=WRONG, label="read wiped rows")],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False, fontsize=FONT)
    fig.suptitle(title, fontsize=10)
    return fig


def _max_abs_per_token(k) -> np.ndarray:
    array = to_numpy(k, "K")
    return np.abs(array.reshape(array.shape[0], -1)).max(axis=1)


def token_label(text: str) -> str:
    """A generated token as a readable label: a space as '·', the end-of-sequence token ('') as 'EOS'."""
    if text == "":
        return "EOS"
    return text.replace(" ", "·")


def causal_chain_figure(chain, inflation: str, title: str | None = None) -> Figure:
    """Four panels for one request of the first batch, fixed (green) vs buggy (red) engine."""
    fig = Figure(figsize=(MAX_WIDTH_IN, 6.6), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=(1.0, 1.0))
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 0]),
            fig.add_subplot(grid[1, 1])]
    tokens = np.arange(chain.k_fixed.shape[0])
    ax = axes[0]
    ax.plot(tokens, _max_abs_per_token(chain.k_fixed), "o-", color=RIGHT, markersize=3, label="fixed")
    ax.plot(tokens, _max_abs_per_token(chain.k_buggy), "s-", color=WRONG, markersize=3, label="buggy: scales wiped")
    ax.set_yscale("log")
    ax.set_xlabel("prompt token", fontsize=FONT + 1)
    ax.set_ylabel("max |K| over heads (log)", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    ax.set_title(f"1. K in layer {chain.storage.split('.')[-2]}'s storage:\ninflated {inflation}", fontsize=FONT + 1)
    ax.legend(fontsize=FONT, loc="center right")

    ax = axes[1]
    fixed, buggy = to_numpy(chain.attn_fixed, "attn_fixed", 1), to_numpy(chain.attn_buggy, "attn_buggy", 1)
    ax.bar(tokens - 0.2, fixed, width=0.4, color=RIGHT, label="over the fixed keys")
    ax.bar(tokens + 0.2, buggy, width=0.4, color=WRONG, label="over the wiped keys")
    ax.set_xlabel("prompt token (key)", fontsize=FONT + 1)
    ax.set_ylabel("attention weight", fontsize=FONT + 1)
    ax.set_ylim(0, 1.25)
    ax.tick_params(labelsize=FONT)
    layer = chain.layer.split(".")[-2]
    ax.set_title(f"2. layer {layer}, head {chain.head}, first decode step:\nthe same query over both keys",
                 fontsize=FONT + 1)
    ax.legend(fontsize=FONT, loc="upper left", ncols=2)

    ax = axes[2]
    shown = chain.tokens_fixed or [chain.chosen_fixed]
    n = max(len(chain.tokens_fixed), len(chain.tokens_buggy), chain.diverging_step + 1)
    for row, (label, seq) in enumerate((("fixed", chain.tokens_fixed), ("buggy", chain.tokens_buggy))):
        for i in range(n):
            text = token_label(seq[i]) if i < len(seq) else ""
            same = i < chain.diverging_step
            colour = (RIGHT if row == 0 or same else WRONG) if text else EMPTY
            ax.add_patch(Rectangle((i, -row - 0.4), 0.9, 0.8, facecolor=colour, edgecolor="white"))
            ax.text(i + 0.45, -row, text, ha="center", va="center", color="white", fontsize=FONT + 1)
        ax.text(-0.2, -row, label, ha="right", va="center", fontsize=FONT + 1)
    ax.add_patch(Rectangle((chain.diverging_step - 0.05, -1.5), 1.0, 2.0, fill=False, edgecolor=NEUTRAL,
                           linewidth=1.2))
    ax.set_xlim(-1.6, n + 0.1)
    ax.set_ylim(-2.3, 0.8)
    ax.axis("off")
    ax.text(n / 2 - 0.8, -1.85, f"tokens 0-{chain.diverging_step - 1}: the same winner in both engines, although "
            "every step\nreads the wiped keys; the outlined token is the first that differs"
            if chain.diverging_step else "the very first token already differs", ha="center", va="center",
            fontsize=FONT)
    ax.set_title(f"3. the generated tokens (· a space): they part at token {chain.diverging_step}",
                 fontsize=FONT + 1, loc="left")
    del shown

    ax = axes[3]
    for offset, top, chosen, colour, label in ((-0.2, chain.top_fixed, chain.chosen_fixed, RIGHT, "fixed"),
                                               (0.2, chain.top_buggy, chain.chosen_buggy, WRONG, "buggy")):
        ys = np.arange(len(top)) + offset
        ax.barh(ys, [v for _, v in top], height=0.4, color=colour, label=label,
                edgecolor=[NEUTRAL if t == chosen else colour for t, _ in top], linewidth=1.5)
        for y, (t, v) in zip(ys, top):
            ax.text(max(v, 0), y, f" {token_label(t)}", va="center", fontsize=FONT)
    ax.invert_yaxis()
    ax.set_yticks([])
    ax.set_xlabel("logit (top tokens, best first)", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, hi + 0.15 * (hi - lo))
    ax.set_title(f"4. token {chain.diverging_step}: fixed picks {token_label(chain.chosen_fixed)}, "
                 f"buggy {token_label(chain.chosen_buggy)}", fontsize=FONT + 1)
    ax.legend(fontsize=FONT, loc="lower right")
    fig.suptitle(title or f"Request {chain.request}: wiped scales → inflated keys → attention collapses → "
                          f"a wrong token", fontsize=10)
    return fig


STATE_COLOURS = {"wiped": WRONG, "intact": RIGHT}


def storage_byte_map(smap, title: str | None = None) -> Figure:
    """The KV storages right after the first step (`minikv.repro.scale_wipe_trace.storage_map`), in two
    panels."""
    if not smap.storages:
        raise ValueError("the storage map is empty")
    layout = smap.layout
    fig = Figure(figsize=(MAX_WIDTH_IN, 1.9 + 0.55 * len(smap.storages) + 1.6), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=(0.55 * len(smap.storages) + 0.8, 1.4))
    top, bottom = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    used = max(b for s in smap.storages for b, *_ in s["blocks"]) + 1
    for row, s in enumerate(smap.storages):
        y = -row
        for b, rid, slots, wiped in s["blocks"]:
            colour = WRONG if wiped else RIGHT
            top.add_patch(Rectangle((b, y - 0.35), 0.92, 0.7, facecolor=colour, edgecolor="white"))
            top.text(b + 0.46, y, f"r{rid}", ha="center", va="center", color="white", fontsize=FONT)
        readers = f"; read by {', '.join(map(str, s['readers']))}" if s["readers"] else ""
        top.text(-0.2, y, f"layer {s['owner']}'s storage{readers}", ha="right", va="center", fontsize=FONT)
        if s["wiped_by"] is not None:
            top.text(used + 0.2, y, f"scales wiped by layer {s['wiped_by']}", ha="left", va="center",
                     fontsize=FONT, color=WRONG)
    top.set_xlim(-0.1, used + 3.2)
    top.set_ylim(-len(smap.storages) + 0.4, 0.6)
    top.set_yticks([])
    top.set_xticks(range(0, used, max(1, used // 12)))
    top.tick_params(labelsize=FONT)
    top.set_xlabel("block of the pool (the label: the request the block belongs to)", fontsize=FONT)
    for side in ("top", "right", "left"):
        top.spines[side].set_visible(False)
    top.set_title(f"After step {smap.step}: every block of the first batch, by request and storage",
                  fontsize=FONT + 1, loc="left")
    top.legend(handles=[Patch(color=WRONG, label="rows whose scales a late fill set to 1.0"),
                        Patch(color=RIGHT, label="rows with their own scales")],
               loc="lower center", bbox_to_anchor=(0.5, 1.08), ncols=2, fontsize=FONT, frameon=False)

    pool, block, rid, rows = smap.zoom if smap.zoom else (None, 0, 0, [])
    offset, k_wiped, v_wiped = next((r for r in rows if r[1] or r[2]), rows[0] if rows else (0, False, False))
    x = 0
    code_bytes = layout.head_size * layout.elem_bytes
    for half, wiped in (("K", k_wiped), ("V", v_wiped)):
        for head in range(layout.num_kv_heads):
            bottom.add_patch(Rectangle((x, 0), code_bytes, 1, facecolor=POOL_COLOURS[0], edgecolor="white"))
            bottom.text(x + code_bytes / 2, 0.5, f"{code_bytes} codes", ha="center", va="center", color="white",
                        fontsize=FONT)
            bottom.text(x + (code_bytes + 4) / 2, 1.15, f"{half} row, kv head {head}", ha="center", va="bottom",
                        fontsize=FONT)
            bottom.add_patch(Rectangle((x + code_bytes, 0), 4, 1, facecolor=WRONG if wiped else SCALE,
                                       edgecolor="white"))
            bottom.text(x + code_bytes + 2, -0.15, "1.0" if wiped else "scale", ha="center", va="top",
                        fontsize=FONT, color=WRONG if wiped else NEUTRAL)
            x += code_bytes + 4 + 3
    bottom.set_xlim(-1, max(x, 1))
    bottom.set_ylim(-0.7, 1.7)
    bottom.axis("off")
    layer = pool.split(".")[-2] if pool else "?"
    bottom.set_title(f"Slot {offset} of block {block} (request {rid}), layer {layer}'s storage: the codes survive, "
                     "the scales read 1.0", fontsize=FONT + 1, loc="left")
    bottom.legend(handles=[Patch(color=POOL_COLOURS[0], label="int8 codes (unchanged)"),
                           Patch(color=WRONG, label="fp32 scale, now 1.0 (wiped)"),
                           Patch(color=SCALE, label="fp32 scale (its own)")],
                  loc="upper center", bbox_to_anchor=(0.5, -0.02), ncols=3, fontsize=FONT, frameon=False)
    fig.suptitle(title or "Defect A's byte map: which request's rows lost their scales, to which layer", fontsize=10)
    return fig


def request_sources_grid(damaged: Sequence[bool], max_num_seqs: int, sources: Mapping[int, int],
                         title: str = "Requests by scheduled batch") -> Figure:
    """Requests as batches (rows) x slots (columns), green right and red wrong, like `minikv.viz.request_grid`;
    a request that reused blocks from the prefix cache says whose: `sources[i] = j` draws "i / from j"."""
    if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be a positive int, got {max_num_seqs!r}")
    flags = [bool(d) for d in damaged]
    if not flags:
        raise ValueError("damaged must list at least one request")
    for i, j in sources.items():
        if not (0 <= i < len(flags) and 0 <= j < len(flags)):
            raise ValueError(f"sources names request {i} <- {j}, outside 0..{len(flags) - 1}")
    rows = -(-len(flags) // max_num_seqs)
    grid = np.full((rows, max_num_seqs), 0)
    for i, bad in enumerate(flags):
        grid[i // max_num_seqs, i % max_num_seqs] = 3 if bad else 2
    fig, ax = new_figure(figsize=(1.1 * max_num_seqs + 2.6, 0.75 * rows + 1.4))
    ax.imshow(grid, cmap=_STATE_CMAP, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
    for i in range(len(flags)):
        text = f"{i}" + (f"\nfrom {sources[i]}" if i in sources else "")
        ax.text(i % max_num_seqs, i // max_num_seqs, text, ha="center", va="center", fontsize=FONT, color="white")
    ax.set_xticks(range(max_num_seqs))
    ax.set_yticks(range(rows))
    ax.set_xlabel("slot in batch")
    ax.set_ylabel("batch")
    ax.set_title(f"{title}: {sum(flags)} of {len(flags)} wrong", fontsize=10)
    handles = [Patch(color=RIGHT, label="right"), Patch(color=WRONG, label="wrong")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=FONT,
              title="from j: reused\nj's cached blocks" if sources else None, title_fontsize=FONT)
    return fig

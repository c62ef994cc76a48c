"""Figures of the paged KV cache: block tables and physical blocks, the slot mapping, which layer's pool each
layer reads, fragmentation, and a pool's byte map (notebooks 01, 03 and 04).
See docs/internals.md#viz-paged."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .style import (
    EMPTY,
    FONT,
    GUARD,
    MAX_WIDTH_IN,
    NEUTRAL,
    POOL_COLOURS,
    RIGHT,
    WRONG,
    new_figure,
    text_fits,
)

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
    """Each sequence's block table (logical blocks, top rows) mapped onto the physical blocks (bottom row)."""
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
    fig, ax = new_figure(figsize=(min(MAX_WIDTH_IN, max(6.0, 0.45 * width + 2.2)), 1.5 + 0.6 * (len(tables) + 2)))
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
    """Where each new token is written: a grid of cache blocks (rows) x offsets in the block (columns)."""
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

    fig, ax = new_figure(figsize=(min(MAX_WIDTH_IN, 0.38 * block_size + 2.2), 1.7 + 0.42 * max(1, len(blocks))))
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
    """Layers (left) and the KV pools of the arena (right): an arrow from each layer to the pool its cache
    tensor is."""
    layers = sorted(int(layer) for layer in kv_owner)
    if not layers:
        raise ValueError("kv_owner is empty: pass {layer: the layer whose pool it uses}")
    pools = sorted({int(kv_owner[layer]) for layer in layers})
    for layer in layers:
        if kv_owner[layer] != layer and kv_owner[kv_owner[layer]] != kv_owner[layer]:
            raise ValueError(f"layer {layer} shares layer {kv_owner[layer]}'s pool, which is not a KV-owning layer")
    kinds = [t.split("_")[0] for t in layer_types] if layer_types is not None else None
    kind_colour = {k: POOL_COLOURS[i % len(POOL_COLOURS)] for i, k in enumerate(dict.fromkeys(kinds or ["pool"]))}
    fig, ax = new_figure(figsize=(6.4, 0.5 * len(layers) + 1.6))
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
    """Tokens reserved per sequence by a contiguous max-length cache and by a paged cache, against tokens
    used."""
    lens = [int(n) for n in seq_lens]
    if not lens:
        raise ValueError("seq_lens must list at least one sequence")
    if block_size < 1 or max_seq_len < max(lens) or min(lens) < 0:
        raise ValueError(f"need block_size >= 1 and 0 <= every length <= max_seq_len ({max_seq_len}), got "
                         f"block_size={block_size}, seq_lens={lens}")
    used = np.array(lens)
    paged = np.array([math.ceil(n / block_size) * block_size for n in lens])
    contiguous = np.full(len(lens), max_seq_len)

    fig, ax = new_figure(figsize=(min(MAX_WIDTH_IN, max(5.0, 0.4 * len(lens) + 1.6)), 4.2))
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
    """The arena as a horizontal byte bar, and where each block lands with the correct and the doubled
    stride."""
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
    fig, ax = new_figure(figsize=(MAX_WIDTH_IN, 3.2))
    pool_colour = {}
    for kind, name, start, end in regions:
        if kind == "pool":
            pool_colour[name] = POOL_COLOURS[len(pool_colour) % len(POOL_COLOURS)]
            ax.add_patch(Rectangle((start, 2), end - start, 0.8, facecolor=pool_colour[name], edgecolor="white"))
            if text_fits(ax, name, end - start, total):
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

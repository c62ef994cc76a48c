"""The figures of defect A's picture story (notebook 03): who touches the shared storage when, and how a wiped
scale becomes a wrong token.

Each function takes plain data (from `minikv.repro.scale_wipe_trace` or lists) and returns a new, unshown
matplotlib Figure, like `minikv.viz`. Colour means one thing, as there: red is WRONG (a fill that wipes written
scales, a read of wiped rows, the buggy engine's values, a damaged request), green is RIGHT; grey is neutral.

    timeline_figure(buggy_timeline, fixed_timeline)   layers x (warmup, step 0, decode steps), both engines
    wiped_reads_figure(timeline)                      which layers read wiped rows at which steps, a whole run
    causal_chain_figure(chain, inflation)             K magnitudes -> one head's attention -> the first wrong token
    request_sources_grid(damaged, max_num_seqs, src)  the request grid, each reuser naming whose cached blocks it read
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minikv.viz import EMPTY, NEUTRAL, RIGHT, WRONG, _new_figure, _to_numpy

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
_LEGEND = [Patch(color=QUIET, label="write / fill that wipes nothing"), Patch(color=RIGHT, label="read: own scales"),
           Patch(color=WRONG, label="F! fill wipes written scales;  R! read of wiped rows")]


def timeline_figure(*timelines, title: str = "Who touches the shared storages, and when") -> Figure:
    """One panel per engine (e.g. buggy then fixed): layers (rows) x warmup and engine steps (columns).

    Each cell lists what the layer did in order: W wrote its own pool, F filled the storage's scales with 1.0
    (wiping nothing), F! filled them after real scales were written (the wipe), R read K/V with their own scales,
    R! read rows whose scales had been wiped. Red cells are wrong.
    """
    if not timelines:
        raise ValueError("timeline_figure needs at least one Timeline")
    width = max(len(t.columns) for t in timelines)
    fig, axes = _new_figure(len(timelines), 1, figsize=(1.0 + 0.62 * width + 1.6, 0.42 * sum(t.num_layers + 2
                                                                                              for t in timelines)))
    axes = np.atleast_1d(axes)
    for ax, t in zip(axes, timelines):
        grid = np.array([[_cell_state(t.events(layer, c)) for c in t.columns] for layer in range(t.num_layers)])
        ax.imshow(grid, cmap=_STATE_CMAP, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
        for layer in range(t.num_layers):
            for j, c in enumerate(t.columns):
                text = " ".join(CODES[e] for e in t.events(layer, c))
                ax.text(j, layer, text, ha="center", va="center", fontsize=7,
                        color="white" if grid[layer, j] in (2, 3) else NEUTRAL)
        ax.set_xticks(range(len(t.columns)), _column_labels(t), fontsize=7)
        ax.set_yticks(range(t.num_layers), _layer_labels(t), fontsize=7)
        ax.set_xticks(np.arange(-0.5, len(t.columns)), minor=True)
        ax.set_yticks(np.arange(-0.5, t.num_layers), minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"{'buggy' if t.buggy else 'fixed'} engine", loc="left", fontsize=9)
    axes[-1].set_xlabel("engine step (a layer runs top to bottom within a step)")
    fig.legend(handles=_LEGEND, loc="outside lower center", ncols=3, fontsize=7, frameon=False)
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
    fig, ax = _new_figure(figsize=(min(14.0, 2.5 + 0.14 * len(columns)), 3.2))
    ax.imshow(grid, cmap=_STATE_CMAP, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(timeline.num_layers), _layer_labels(timeline), fontsize=7)
    starts = [j for j, c in enumerate(columns) if timeline.phases.get(c) == "prefill"]
    for j in starts:
        ax.axvline(j - 0.5, color="white", linewidth=1.5)
    ax.set_xticks(starts, [columns[j].removeprefix("step ") for j in starts], fontsize=7)
    ax.set_xlabel("engine step (white lines: a prefill step, where a new batch starts)")
    ax.legend(handles=[Patch(color=RIGHT, label="read own scales"), Patch(color=WRONG, label="read wiped rows")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=7)
    ax.set_title(title)
    return fig


def _max_abs_per_token(k) -> np.ndarray:
    array = _to_numpy(k, "K")
    return np.abs(array.reshape(array.shape[0], -1)).max(axis=1)


def causal_chain_figure(chain, inflation: str, title: str | None = None) -> Figure:
    """Three panels for one request of the first batch, fixed (green) vs buggy (red) engine.

    1. the largest |K| of each prompt token in the shared storage (log scale); `inflation` is the quoted statistic
       (e.g. "x46", from `minikv.repro.scale_wipe.quantities`), shown as given, not recomputed;
    2. one query head's attention weights over those keys (the same query against both engines' keys);
    3. the top logits at the first generated token where the engines disagree, the chosen token outlined.
    """
    fig, axes = _new_figure(1, 3, figsize=(13.0, 3.8), width_ratios=(1.1, 1.1, 1.0))
    tokens = np.arange(chain.k_fixed.shape[0])
    ax = axes[0]
    ax.plot(tokens, _max_abs_per_token(chain.k_fixed), "o-", color=RIGHT, markersize=3, label="fixed")
    ax.plot(tokens, _max_abs_per_token(chain.k_buggy), "s-", color=WRONG, markersize=3, label="buggy (scales wiped)")
    ax.set_yscale("log")
    ax.set_xlabel("prompt token")
    ax.set_ylabel("max |K| over heads (log)")
    ax.set_title(f"1. K in layer {chain.storage.split('.')[-2]}'s storage: inflated {inflation}", fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[1]
    fixed, buggy = _to_numpy(chain.attn_fixed, "attn_fixed", 1), _to_numpy(chain.attn_buggy, "attn_buggy", 1)
    ax.bar(tokens - 0.2, fixed, width=0.4, color=RIGHT, label="fixed keys")
    ax.bar(tokens + 0.2, buggy, width=0.4, color=WRONG, label="wiped keys")
    ax.set_xlabel("prompt token (key)")
    ax.set_ylabel("attention weight")
    layer = chain.layer.split(".")[-2]
    ax.set_title(f"2. layer {layer}, head {chain.head}: the same query", fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[2]
    for offset, top, chosen, colour, label in ((-0.2, chain.top_fixed, chain.chosen_fixed, RIGHT, "fixed"),
                                               (0.2, chain.top_buggy, chain.chosen_buggy, WRONG, "buggy")):
        ys = np.arange(len(top)) + offset
        ax.barh(ys, [v for _, v in top], height=0.4, color=colour, label=label,
                edgecolor=[NEUTRAL if t == chosen else colour for t, _ in top], linewidth=1.5)
        for y, (t, v) in zip(ys, top):
            ax.text(v, y, f" {t!r}", va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_yticks([])
    ax.set_xlabel("logit (top tokens, best first)")
    ax.set_title(f"3. generated token {chain.diverging_step}: {chain.chosen_fixed!r} vs {chain.chosen_buggy!r}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title or f"Request {chain.request}: wiped scales -> inflated keys -> attention collapses -> "
                          f"a wrong token")
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
    fig, ax = _new_figure(figsize=(1.1 * max_num_seqs + 2.6, 0.75 * rows + 1.4))
    ax.imshow(grid, cmap=_STATE_CMAP, vmin=0, vmax=3, aspect="auto", interpolation="nearest")
    for i in range(len(flags)):
        text = f"{i}" + (f"\nfrom {sources[i]}" if i in sources else "")
        ax.text(i % max_num_seqs, i // max_num_seqs, text, ha="center", va="center", fontsize=8, color="white")
    ax.set_xticks(range(max_num_seqs))
    ax.set_yticks(range(rows))
    ax.set_xlabel("slot in batch")
    ax.set_ylabel("batch")
    ax.set_title(f"{title}: {sum(flags)} of {len(flags)} wrong", fontsize=10)
    handles = [Patch(color=RIGHT, label="right"), Patch(color=WRONG, label="wrong")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8,
              title="from j: reused\nj's cached blocks" if sources else None, title_fontsize=7)
    return fig

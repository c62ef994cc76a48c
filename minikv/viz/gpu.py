"""The figures of notebook 05 (the kernels on a GPU), drawn from the rows of its benchmark CSV.
See docs/internals.md#viz-gpu."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .style import FONT, MAX_WIDTH_IN, NEUTRAL, new_figure

COLOUR = {"auto": "C0", "fp8": "C1", "int8_per_token_head": "C2", "fp8_per_token_head": "C4"}
MARKER = {"auto": "o", "fp8": "D", "int8_per_token_head": "s", "fp8_per_token_head": "^"}
# int8 and fp8 per-token-head move the same bytes and take about the same time: int8's larger squares are drawn first,
# fp8's smaller triangles on top of them, so both stay visible.
MARKER_SIZE = {"auto": 5, "fp8": 6, "int8_per_token_head": 8, "fp8_per_token_head": 5}
DRAW_ORDER = ("auto", "fp8", "int8_per_token_head", "int8_per_token_head/block", "fp8_per_token_head",
              "fp8_per_token_head/block")
LABEL = {"auto": "bf16", "fp8": "fp8 per tensor", "int8_per_token_head": "int8 per-token-head (row)",
         "fp8_per_token_head": "fp8 per-token-head (row)", "int8_per_token_head/block": "int8 per-token-head (block)",
         "fp8_per_token_head/block": "fp8 per-token-head (block)"}


def _base(fmt: str) -> str:
    return fmt.split("/")[0]


def style(fmt: str) -> dict:
    """Colour and marker by format; the block placement dotted and hollow."""
    block = fmt.endswith("/block")
    return {"color": COLOUR.get(_base(fmt), NEUTRAL), "marker": MARKER.get(_base(fmt), "o"),
            "linestyle": ":" if block else "-", "markerfacecolor": "none" if block else COLOUR.get(_base(fmt)),
            "markersize": MARKER_SIZE.get(_base(fmt), 5)}


def label(fmt: str) -> str:
    return LABEL.get(fmt, fmt)


def _decode(rows: Sequence[dict]) -> list[dict]:
    out = [r for r in rows if r["kind"] == "decode"]
    if not out:
        raise ValueError("no decode rows: pass the rows of notebooks/data/gpu_attention.csv")
    return out


def _formats(decode: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["format"] for r in decode))


def _legend_below(fig: Figure, formats: Sequence[str], extra: Sequence = ()) -> None:
    handles = [Line2D([], [], label=label(f), **style(f)) for f in formats] + list(extra)
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=FONT, frameon=False)


def bandwidth_figure(rows: Sequence[dict], title: str = "Paged decode bandwidth against the copy ceiling") -> Figure:
    """Achieved GB/s (KV rows with their scales, queries, block tables read; outputs written) against the batch,
    one panel per context length, with the device-to-device copy bandwidth of the same run as a dashed line."""
    decode = _decode(rows)
    contexts = sorted({int(r["context"]) for r in decode})
    copy = float(rows[0]["copy_GBps"])
    fig, axes = new_figure(1, len(contexts), figsize=(MAX_WIDTH_IN, 3.9), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, ctx in zip(axes, contexts):
        for fmt in _formats(decode):
            pts = sorted((int(r["batch"]), r["GBps"]) for r in decode if r["format"] == fmt and int(r["context"]) == ctx)
            ax.plot([b for b, _ in pts], [g for _, g in pts], **style(fmt))
        ax.axhline(copy, color="black", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"context {ctx}", fontsize=FONT + 1)
        ax.set_xlabel("batch", fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT)
    axes[0].set_ylabel("achieved GB/s", fontsize=FONT + 1)
    _legend_below(fig, _formats(decode), [Line2D([], [], color="black", linestyle="--",
                                                 label=f"device copy, {copy:,.0f} GB/s")])
    fig.suptitle(title, fontsize=10)
    return fig


def roofline_figure(rows: Sequence[dict], title: str = "Paged decode time against the memory roofline "
                                                     "(every shape)") -> Figure:
    """Time per decode step against the bytes it moves, every format at every shape, log-log, with the roofline
    (bytes / copy bandwidth of the same run) as a dashed line. Block-placement points are hollow."""
    decode = _decode(rows)
    copy = float(rows[0]["copy_GBps"])
    fig, ax = new_figure(figsize=(MAX_WIDTH_IN, 5.4))
    order = sorted(_formats(decode), key=lambda f: DRAW_ORDER.index(f) if f in DRAW_ORDER else len(DRAW_ORDER))
    for z, fmt in enumerate(order):
        pts = [(r["bytes"] / 1e6, 1e3 * r["ms"]) for r in decode if r["format"] == fmt]
        st = style(fmt) | {"linestyle": "none"}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], zorder=2 + z, alpha=0.85, **st)
    span = np.array([min(r["bytes"] for r in decode), max(r["bytes"] for r in decode)]) / 1e6
    ax.plot(span, span * 1e6 / (copy * 1e3), color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes moved by one decode step (MB)", fontsize=FONT + 1)
    ax.set_ylabel("time per decode step (µs)", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    _legend_below(fig, order, [Line2D([], [], color="black", linestyle="--",
                                      label="roofline: bytes / copy bandwidth")])
    fig.suptitle(title, fontsize=10)
    return fig


def roofline_bars_figure(rows: Sequence[dict], shapes: Sequence[tuple[int, int]],
                         title: str = "Paged decode time (bars) against the memory roofline (black marks)") -> Figure:
    """One panel per (batch, context) of `shapes`: a bar per format, in the legend's order (hatched: block
    placement), and, as a black mark, the roofline time of the bytes it moves."""
    decode = _decode(rows)
    copy = float(rows[0]["copy_GBps"])
    by = {(r["format"], int(r["batch"]), int(r["context"])): r for r in decode}
    formats = _formats(decode)
    fig, axes = new_figure(1, len(shapes), figsize=(MAX_WIDTH_IN, 4.2), sharey=False)
    axes = np.atleast_1d(axes)
    for ax, (b, c) in zip(axes, shapes):
        x = np.arange(len(formats))
        ax.bar(x, [1e3 * by[(f, b, c)]["ms"] for f in formats], color=[COLOUR.get(_base(f)) for f in formats],
               hatch=["//" if f.endswith("/block") else "" for f in formats], edgecolor="white")
        ax.scatter(x, [by[(f, b, c)]["bytes"] / (copy * 1e3) for f in formats], marker="_", s=300, color="black",
                   zorder=3)
        ax.set_xticks([])
        ax.tick_params(axis="y", labelsize=FONT)
        ax.set_title(f"batch {b}, context {c}", fontsize=FONT + 1)
    axes[0].set_ylabel("time per decode step (µs)", fontsize=FONT + 1)
    handles = [Patch(facecolor=COLOUR.get(_base(f)), hatch="//" if f.endswith("/block") else "", edgecolor="white",
                     label=label(f)) for f in formats]
    handles.append(Line2D([], [], color="black", marker="_", markersize=14, linestyle="none",
                          label="roofline time of its bytes"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=FONT, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def _ratio_panels(decode: list[dict], column: str, other: str, height: float, title: str) -> Figure:
    """`column` (another kernel's time over minikv's) against the batch, one panel per context length, a line per
    format, with the dashed line at 1 where minikv is as fast as `other`."""
    contexts = sorted({int(r["context"]) for r in decode})
    fig, axes = new_figure(1, len(contexts), figsize=(MAX_WIDTH_IN, height), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, ctx in zip(axes, contexts):
        for fmt in _formats(decode):
            pts = sorted((int(r["batch"]), float(r[column])) for r in decode
                         if r["format"] == fmt and int(r["context"]) == ctx)
            ax.plot([b for b, _ in pts], [v for _, v in pts], **style(fmt))
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"context {ctx}", fontsize=FONT + 1)
        ax.set_xlabel("batch", fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT)
    axes[0].set_ylabel(f"{other} time / minikv time", fontsize=FONT + 1)
    _legend_below(fig, _formats(decode), [Line2D([], [], color="black", linestyle="--", label=f"as fast as {other}")])
    fig.suptitle(title, fontsize=10)
    return fig


def sdpa_ratio_figure(rows: Sequence[dict], title: str = "Against the best unpaged bf16 kernel: SDPA time / "
                                                         "minikv time") -> Figure:
    """SDPA's time on a contiguous bf16 cache over minikv's time on each format, against the batch, one panel per
    context length; above the dashed line at 1, minikv on that format is faster than SDPA on bf16."""
    return _ratio_panels(_decode(rows), "sdpa_over_minikv", "SDPA", 3.8, title)


def peer_figure(rows: Sequence[dict], title: str = "Against FlashInfer's paged decode on the same pools: "
                                                   "FlashInfer time / minikv time") -> Figure:
    """FlashInfer's time over minikv's (the `--peer flashinfer` columns) against the batch, one panel per context
    length, for the formats both libraries have; above the dashed line at 1, minikv is faster."""
    decode = [r for r in _decode(rows) if r.get("flashinfer_ms") not in (None, "")]
    if not decode:
        raise ValueError("no FlashInfer figures: the CSV was recorded without --peer flashinfer")
    return _ratio_panels(decode, "flashinfer_over_minikv", "FlashInfer", 3.6, title)


ENGINE_MODES = {"replayed": ("-", "CUDA graphs (the default)"), "eager": ("--", "eager (enforce_eager=True)")}


def engine_context_figure(rows: Sequence[dict], batch: int | None = None,
                          title: str = "The engine's decode speed against the context") -> Figure:
    """Decode tokens/s of the engine (kind "engine-decode") per format against the prompt length at one batch (the
    largest measured), solid with CUDA graphs, dashed eager; every format at every context of the run."""
    engine = [r for r in rows if r["kind"] == "engine-decode" and r.get("mode") in ENGINE_MODES]
    if not engine:
        raise ValueError("no engine rows: the CSV was recorded without the engine (attention --engine)")
    batch = batch or max(int(r["batch"]) for r in engine)
    engine = [r for r in engine if int(r["batch"]) == batch]
    fig, ax = new_figure(1, 1, figsize=(MAX_WIDTH_IN * 0.75, 4.0))
    formats = list(dict.fromkeys(f for f in DRAW_ORDER for r in engine if r["format"] == f))
    for fmt in formats:
        for mode, (linestyle, _) in ENGINE_MODES.items():
            pts = sorted((int(r["context"]), float(r["tokens_per_s"])) for r in engine
                         if r["format"] == fmt and r["mode"] == mode)
            if pts:
                ax.plot([c for c, _ in pts], [t for _, t in pts], **{**style(fmt), "linestyle": linestyle})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens per sequence (context)", fontsize=FONT + 1)
    ax.set_ylabel(f"decode tokens/s at batch {batch}", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    extra = [Line2D([], [], color="black", linestyle=ls, label=text) for ls, text in ENGINE_MODES.values()]
    _legend_below(fig, formats, extra)
    fig.suptitle(title, fontsize=10)
    return fig


SHORT_LABEL = {"auto": "bf16", "fp8": "fp8\nper tensor", "int8_per_token_head": "int8 per\ntoken-head",
               "fp8_per_token_head": "fp8 per\ntoken-head"}


def capacity_figure(rows: Sequence[dict], title: str = "What a fixed KV budget holds, and what it decodes") -> Figure:
    """Per format, from `minikv.bench engine --capacity` rows (mode "capacity"): left, the most sequences whose KV
    fits the budget at the run's context; right, the decode tokens/s at that batch over bf16's at its own, both
    from one run (rows with one `source`)."""
    capacity = [r for r in rows if r.get("mode") == "capacity"]
    if not capacity:
        raise ValueError("no capacity rows: record them with `python -m minikv.bench engine --device cuda --capacity`")
    bf16 = {r.get("source", ""): r for r in capacity if r["format"] == "auto"}
    found: dict[str, tuple[int, float]] = {}
    for r in capacity:
        base = bf16.get(r.get("source", ""))
        if base is None:
            raise ValueError(f"the capacity rows of {r.get('source', '')!r} have no bf16 row to compare with")
        found.setdefault(r["format"], (int(r["batch"]), float(r["decode_tokens_per_s"])
                                       / float(base["decode_tokens_per_s"])))
    formats = [f for f in DRAW_ORDER if f in found]
    fig, axes = new_figure(1, 2, figsize=(MAX_WIDTH_IN, 3.2))
    for ax, k, what, text in ((axes[0], 0, "sequences that fit", "{:.0f}"),
                              (axes[1], 1, "decode tokens/s, x bf16's", "{:.2f}x")):
        values = [found[f][k] for f in formats]
        ax.bar(range(len(formats)), values, color=[COLOUR[f] for f in formats])
        for i, v in enumerate(values):
            ax.text(i, v, text.format(v), ha="center", va="bottom", fontsize=FONT)
        ax.set_xticks(range(len(formats)), [SHORT_LABEL.get(f, f) for f in formats],
                      fontsize=FONT)
        ax.set_ylabel(what, fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT)
        ax.margins(y=0.15)
    axes[1].axhline(1.0, color=NEUTRAL, linewidth=0.8)
    first = capacity[0]
    fig.suptitle(f"{title}: {float(first['kv_budget_gib']):g} GiB at context {int(first['context'])}", fontsize=10)
    return fig

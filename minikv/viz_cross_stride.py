"""The figures (and the code-site diff) of defect B, cross-attention stride doubling and the FP8 context read.

Like `minikv.viz`, every figure function takes plain data and returns a new `matplotlib.figure.Figure` that is
already closed in pyplot (shown once when a notebook cell returns it). Colours follow `minikv.viz`: red is WRONG
and nothing else (a block written outside its own pool, a value decoded wrong, an output off the exact one);
green is RIGHT.

* `stride_byte_map` - the 1.0x / 1.5x / 2.0x arenas stacked on one byte axis: every cross layer's blocks at the
  doubled stride, labelled by request, and the self-attention blocks they land on.
* `fp8_row_as_16bit` - one FP8 row of the cross cache next to what a 16-bit reader decodes from the same bytes.
* `output_scatter` - cross-attention output against the exact output, one panel per context path.
* `code_site_diff` - a HISTORICAL / FIX site as a unified diff, generated from the source itself.
"""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from minikv.viz import EMPTY, GUARD, NEUTRAL, POOL_COLOURS, RIGHT, WRONG, _new_figure, _to_numpy

KB = 1024


def _short(name: str) -> str:
    """'cross.decoder.1.cross_attn' -> 'cross 1'; 'kv.decoder.0.self_attn' -> 'self 0'."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[1] == "decoder":
        return f"{'cross' if parts[0] == 'cross' else 'self'} {parts[2]}"
    return name


def _check_panel(panel: Mapping) -> None:
    missing = {"title", "regions", "doubled", "self_blocks"} - set(panel)
    if missing:
        raise ValueError(f"each panel needs the keys title, regions, doubled, self_blocks; missing {sorted(missing)} "
                         "(build it with minikv.repro.cross_stride.byte_arrangement)")
    if any(r[0] not in ("pool", "guard") for r in panel["regions"]):
        raise ValueError("each region's kind must be 'pool' or 'guard' (pass KVArena.byte_map())")


def stride_byte_map(panels: Sequence[Mapping], x_max: int | None = None,
                    title: str = "Historical cross stride: where every cross layer's blocks land") -> Figure:
    """One panel per pool factor, all on the same arena-byte axis (KiB).

    Each panel is a dict (see `minikv.repro.cross_stride.byte_arrangement`):
      title        - e.g. "1.5x: 15 blocks per cross pool"
      regions      - `KVArena.byte_map()`: [(kind, name, start, end)]
      doubled      - {cross pool name: [(start, end, request)]}: the arena bytes each block in use spans at the
                     doubled stride; drawn green inside its own pool, red where it lands anywhere else
      self_blocks  - [(start, end, request)]: self-attention blocks of the requests (where stray writes do damage)
      wrong        - optional [request]: requests whose tokens came out wrong (named in the panel's label)
    Rows, top to bottom: the arena (pools and hatched guard zones), one row per cross layer, then the requests'
    self-attention blocks, outlined red where a doubled write covers them.
    """
    if not panels:
        raise ValueError("panels is empty: pass one arrangement per pool factor")
    for p in panels:
        _check_panel(p)
    cross_names = list(panels[0]["doubled"])
    if x_max is None:
        x_max = max(max([e for blocks in p["doubled"].values() for _, e, _ in blocks] or [0]) for p in panels)
        x_max = int(x_max * 1.08) + 4 * KB
    rows = len(cross_names) + 2
    fig, axes = _new_figure(len(panels), 1, figsize=(11.0, 1.0 + 0.42 * rows * len(panels)), sharex=True)
    axes = np.atleast_1d(axes)
    colour = {}
    for ax, p in zip(axes, panels):
        y_arena = rows - 1
        pools = {}
        for kind, name, start, end in p["regions"]:
            if start >= x_max:
                continue
            shown_end = min(end, x_max)
            if kind == "pool":
                pools[name] = (start, end)
                colour.setdefault(name, POOL_COLOURS[len(colour) % len(POOL_COLOURS)])
                ax.add_patch(Rectangle((start / KB, y_arena), (shown_end - start) / KB, 0.8, facecolor=colour[name],
                                       edgecolor="white"))
                ax.text((start + shown_end) / 2 / KB, y_arena + 0.4, _short(name) + ("  ..." if end > x_max else ""),
                        ha="center", va="center", color="white", fontsize=7, clip_on=True)
            else:
                ax.add_patch(Rectangle((start / KB, y_arena), (shown_end - start) / KB, 0.8, facecolor="white",
                                       edgecolor=GUARD, hatch="xxx", linewidth=0.5))
        written = []           # (start, end) of every doubled write that landed outside its own pool
        for i, name in enumerate(cross_names):
            y = y_arena - 1 - i
            lo, hi = pools.get(name, (0, 0))
            for start, end, req in p["doubled"][name]:
                ok = lo <= start and end <= hi
                if not ok:
                    written.append((start, end))
                ax.add_patch(Rectangle((start / KB, y + 0.05), (end - start) / KB, 0.7,
                                       facecolor=RIGHT if ok else WRONG, edgecolor="white", linewidth=0.6))
                ax.text((start + end) / 2 / KB, y + 0.4, str(req), ha="center", va="center", color="white",
                        fontsize=6, clip_on=True)
            ax.text(-0.01, y + 0.4, f"{_short(name)}, doubled", transform=ax.get_yaxis_transform(), ha="right",
                    va="center", fontsize=7)
        y = 0
        for start, end, req in p["self_blocks"]:
            if start >= x_max:
                continue
            hit = any(s < end and start < e for s, e in written)
            ax.add_patch(Rectangle((start / KB, y + 0.05), (min(end, x_max) - start) / KB, 0.7, facecolor=EMPTY,
                                   edgecolor=WRONG if hit else NEUTRAL, linewidth=1.6 if hit else 0.4))
            ax.text((start + min(end, x_max)) / 2 / KB, y + 0.4, str(req), ha="center", va="center",
                    color=WRONG if hit else NEUTRAL, fontsize=6, clip_on=True)
        ax.text(-0.01, 0.4, "self-attn blocks", transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=7)
        ax.text(-0.01, y_arena + 0.4, "arena", transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=7)
        wrong = p.get("wrong")
        label = p["title"] + ("" if wrong is None else
                              f"; wrong requests: {', '.join(map(str, wrong)) if wrong else 'none'}")
        ax.set_title(label, fontsize=9, loc="left")
        ax.set_ylim(-0.1, rows)
        ax.set_yticks([])
        ax.set_xlim(0, x_max / KB)
    axes[-1].set_xlabel("arena byte offset (KiB); block labels are request numbers")
    axes[-1].legend(handles=[Patch(facecolor="white", edgecolor=GUARD, hatch="xxx", label="guard zone"),
                             Patch(color=RIGHT, label="block inside its own pool"),
                             Patch(color=WRONG, label="block outside its own pool"),
                             Patch(facecolor=EMPTY, edgecolor=WRONG, label="self-attn block under a stray write")],
                    loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def fp8_row_as_16bit(row_bytes, fp8_values, read_values, title: str = "One FP8 K row, read as 16-bit") -> Figure:
    """Top: the bytes a 16-bit reader fetches for one row (the FP8 row's `head_size` bytes and the next
    `head_size`), the FP8 row's elements being one byte each. Bottom: element j of the row as the FP8 cache holds
    it (green) and as the 16-bit reader decodes it from bytes 2j, 2j+1 (red where it differs).

    row_bytes: [2 * head_size] uint8; fp8_values: [head_size] the FP8 row decoded; read_values: [head_size] the
    16-bit reader's decoding (may hold inf/NaN, drawn at the axis edge)."""
    raw = _to_numpy(row_bytes, "row_bytes", ndim=1).astype(np.int64)
    want = _to_numpy(fp8_values, "fp8_values", ndim=1)
    got = _to_numpy(read_values, "read_values", ndim=1)
    n = want.shape[0]
    if raw.shape[0] != 2 * n or got.shape[0] != n:
        raise ValueError(f"row_bytes must hold 2 x head_size bytes and read_values head_size values; got "
                         f"{raw.shape[0]} bytes, {n} FP8 values, {got.shape[0]} read values")
    fig, (top, bottom) = _new_figure(2, 1, figsize=(10.0, 5.2), height_ratios=(1.0, 2.2))
    for b in range(2 * n):
        mine = b < n
        top.add_patch(Rectangle((b, 1.0), 1, 0.8, facecolor=POOL_COLOURS[0] if mine else EMPTY,
                                edgecolor="white", linewidth=0.5))
        top.text(b + 0.5, 1.4, f"{raw[b]:02x}", ha="center", va="center", fontsize=5,
                 color="white" if mine else NEUTRAL)
    for j in range(n):
        bad = not (np.isfinite(got[j]) and got[j] == want[j])
        top.add_patch(Rectangle((2 * j, 0.0), 2, 0.8, facecolor=WRONG if bad else RIGHT, edgecolor="white",
                                linewidth=0.8))
        top.text(2 * j + 1, 0.4, str(j), ha="center", va="center", fontsize=5, color="white")
    top.text(-0.5, 1.4, "bytes (hex)", ha="right", va="center", fontsize=7)
    top.text(-0.5, 0.4, "16-bit elements", ha="right", va="center", fontsize=7)
    top.text(n / 2, 2.05, f"the FP8 row: {n} elements, 1 byte each", ha="center", fontsize=7)
    top.text(1.5 * n, 2.05, "the next row's bytes", ha="center", fontsize=7, color=NEUTRAL)
    top.set_xlim(-0.2, 2 * n + 0.2)
    top.set_ylim(-0.1, 2.4)
    top.axis("off")
    finite = got[np.isfinite(got)]
    span = max(np.abs(want).max(), np.abs(finite).max() if finite.size else 1.0, 1e-3) * 1.15
    shown = np.where(np.isfinite(got), got, np.sign(np.nan_to_num(got, nan=1.0)) * span)
    x = np.arange(n)
    bottom.axhline(0, color=NEUTRAL, linewidth=0.5)
    bottom.scatter(x, want, color=RIGHT, s=22, label="element as the FP8 cache holds it", zorder=3)
    bad = ~(np.isfinite(got) & (got == want))
    bottom.scatter(x[bad], shown[bad], color=WRONG, marker="x", s=28, label="as the 16-bit reader decodes it",
                   zorder=4)
    bottom.scatter(x[~bad], shown[~bad], color=RIGHT, marker="x", s=28, zorder=4)
    for j in range(n):
        bottom.plot([j, j], [want[j], shown[j]], color=WRONG if bad[j] else RIGHT, linewidth=0.5, alpha=0.6)
    bottom.set_yscale("symlog", linthresh=max(np.abs(want).max() / 4, 1e-3))
    bottom.set_xlabel("element of the row (head dimension)")
    bottom.set_ylabel("value (symlog)")
    bottom.legend(fontsize=8, loc="best")
    bottom.set_title(f"{int(bad.sum())} of {n} elements decoded wrong", fontsize=9)
    fig.suptitle(title, fontsize=10)
    return fig


def output_scatter(samples: Mapping[str, object], tolerance: float = 0.02,
                   title: str = "Cross-attention output at the context step vs exact") -> Figure:
    """One panel per version: every output element at the context step against the exact one.

    samples: {label: [(exact, got), ...]} (e.g. `ContextRun.samples`). A point is red when |got - exact| exceeds
    `tolerance` x max|exact| of its panel, green otherwise; the diagonal is where a right output lies."""
    if not samples:
        raise ValueError("samples is empty: pass {version: [(exact, got), ...]}")
    fig, axes = _new_figure(1, len(samples), figsize=(3.4 * len(samples), 3.4))
    axes = np.atleast_1d(axes)
    for ax, (label, pairs) in zip(axes, samples.items()):
        arr = _to_numpy(pairs, f"samples[{label!r}]", ndim=2)
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
        ax.set_xlabel("exact")
        ax.set_title(f"{label}\n{int(bad.sum())} of {len(exact)} elements off", fontsize=9)
    axes[0].set_ylabel("output")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title + f" (off: |out - exact| > {tolerance:g} x max|exact|)", fontsize=10)
    return fig


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def site_versions(source: str) -> tuple[list[str], list[str]]:
    """(historical, fixed) source lines of a function with one HISTORICAL / FIX site.

    The site is an `if <switch>:` whose block starts with a `# HISTORICAL` comment. Its FIX is the `else:` block,
    or, without one, the rest of the enclosing block after the `if` (the historical branch returns early). When
    the condition also holds a real test (`if self.historical_x and not self.paged_context:`), the historical
    version keeps that test (`if not self.paged_context:`) and falls through to the rest, as the old code did."""
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


__all__ = ["stride_byte_map", "fp8_row_as_16bit", "output_scatter", "site_versions", "code_site_diff"]

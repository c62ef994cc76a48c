"""The bandwidth figure of the kernel benchmarks (notebook 05). See docs/internals.md#viz-performance."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from .style import FONT, NEUTRAL, POOL_COLOURS, new_figure

# ---- performance ----------------------------------------------------------------------------------------------

def bandwidth_plot(rows: Sequence, copy_gbps: float, title: str = "Achieved memory bandwidth") -> Figure:
    """Horizontal bars of GB/s per measurement, with a dashed line at a plain device copy's GB/s for
    reference."""
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

    fig, ax = new_figure(figsize=(7.5, 1.2 + 0.35 * len(items)))
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

"""The picture of a search: which cell each scenario ran in, in order, and where an invariant first failed.
See docs/internals.md#hunt-figure."""
from __future__ import annotations

import matplotlib.pyplot as plt

from minikv.viz import NEUTRAL, RIGHT, WRONG

from .strategies import cell_label

FONT = 8                 # points: the smallest text the project's figures may show
WIDTH_IN = 8.2           # inches: within the site's column (minikv.viz.SHOWN_WIDTH_PX at 100 dpi), never scaled down


def search_map(reports: dict, title: str = "What the hunter ran, in order") -> object:
    cells = next(iter(reports.values())).cells
    for report in reports.values():
        cells = cells + [c for c in report.cells if c not in cells]
    row = {c: i for i, c in enumerate(cells)}
    per_panel = 0.55 + 0.16 * len(cells)
    fig, axes = plt.subplots(len(reports), 1, figsize=(WIDTH_IN, 0.6 + per_panel * len(reports)), sharex=True,
                             squeeze=False, layout="constrained")
    plt.close(fig)                       # returned unshown; a notebook displays it as the cell's value
    for ax, (label, report) in zip(axes[:, 0], reports.items()):
        first = report.finding.scenarios_before if report.finding else len(report.tried)
        ys = [row[(s.model, s.kv_cache_dtype, s.dtype)] for s in report.tried]
        xs = list(range(1, len(ys) + 1))
        refused = {id(s) for s in report.refused_scenarios}
        ran = [i for i in range(first) if id(report.tried[i]) not in refused]
        out = [i for i in range(first) if id(report.tried[i]) in refused]
        if ran:
            ax.scatter([xs[i] for i in ran], [ys[i] for i in ran], s=12, color=RIGHT, label="passed")
        if out:
            ax.scatter([xs[i] for i in out], [ys[i] for i in out], s=12, facecolors="none", edgecolors=NEUTRAL,
                       linewidths=0.6, label="refused by the engine (outside its domain)")
        if report.finding:
            if xs[first + 1:]:
                ax.scatter(xs[first + 1:], ys[first + 1:], s=6, color=WRONG, alpha=0.6, zorder=3,
                           label="run while shrinking the failure")
            ax.scatter([xs[first]], [ys[first]], s=90, marker="X", color=WRONG, label="first failing scenario")
        ax.set_yticks(range(len(cells)), [cell_label(c) for c in cells], fontsize=FONT)
        ax.tick_params(axis="x", labelsize=FONT)
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_title(label, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=FONT, frameon=False, borderaxespad=0)
    axes[-1, 0].set_xlabel("scenario, in the order run", fontsize=FONT + 1)
    fig.suptitle(title, fontsize=10)
    return fig

"""The picture of a search: which cell each scenario ran in, in order, and where an invariant first failed.

    search_map({"fixed engine": report, "defect X": other})   one panel per hunt; rows are cells, columns scenarios

Green dots are scenarios that passed, the red cross is the first failing one, small red dots are the runs spent
shrinking it. Colours follow minikv.viz (red is WRONG, green RIGHT). Returns a new, unshown matplotlib Figure.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from minikv.viz import RIGHT, WRONG


def search_map(reports: dict, title: str = "What the hunter ran, in order") -> object:
    cells = next(iter(reports.values())).cells
    row = {c: i for i, c in enumerate(cells)}
    width = max(len(r.tried) for r in reports.values())
    fig, axes = plt.subplots(len(reports), 1, figsize=(max(7.0, 0.09 * width + 3.5), 1.2 + 2.3 * len(reports)),
                             sharex=True, squeeze=False, layout="constrained")
    plt.close(fig)                       # returned unshown; a notebook displays it as the cell's value
    for ax, (label, report) in zip(axes[:, 0], reports.items()):
        first = report.finding.scenarios_before if report.finding else len(report.tried)
        ys = [row[(s.model, s.kv_cache_dtype, s.dtype)] for s in report.tried]
        xs = list(range(1, len(ys) + 1))
        ax.scatter(xs[:first], ys[:first], s=12, color=RIGHT, label="passed")
        if report.finding:
            ax.scatter(xs[first + 1:], ys[first + 1:], s=6, color=WRONG, alpha=0.5, label="shrinking")
            ax.scatter([xs[first]], [ys[first]], s=90, marker="X", color=WRONG, label="first failure")
        ax.set_yticks(range(len(cells)), [" x ".join(c).replace("_per_token_head", "_pth") for c in cells],
                      fontsize=6)
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_title(label, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("scenario, in the order run")
    axes[0, 0].legend(loc="upper right", fontsize=7)
    fig.suptitle(title)
    return fig

"""The picture of a search: which cell each scenario ran in, in order, and where an invariant first failed.

    search_map({"fixed engine": report, "defect X": other})   one panel per hunt; rows are cells, columns scenarios

Green dots are scenarios that passed, hollow grey ones scenarios the engine refused (outside its domain), the red
cross is the first failing one, small red dots the runs spent shrinking it. Colours follow minikv.viz (red is WRONG,
green RIGHT, grey NEUTRAL). Returns a new, unshown matplotlib Figure.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from minikv.viz import NEUTRAL, RIGHT, WRONG


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
        refused = {id(s) for s in report.refused_scenarios}
        ran = [i for i in range(first) if id(report.tried[i]) not in refused]
        out = [i for i in range(first) if id(report.tried[i]) in refused]
        if ran:
            ax.scatter([xs[i] for i in ran], [ys[i] for i in ran], s=12, color=RIGHT, label="passed")
        if out:
            ax.scatter([xs[i] for i in out], [ys[i] for i in out], s=12, facecolors="none", edgecolors=NEUTRAL,
                       linewidths=0.6, label="refused by the engine")
        if report.finding:
            ax.scatter(xs[first + 1:], ys[first + 1:], s=6, color=WRONG, alpha=0.5, label="shrinking")
            ax.scatter([xs[first]], [ys[first]], s=90, marker="X", color=WRONG, label="first failure")
        ax.set_yticks(range(len(cells)), [" x ".join(c).replace("_per_token_head", "_pth") for c in cells],
                      fontsize=6)
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_title(label, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="best", fontsize=6)
    axes[-1, 0].set_xlabel("scenario, in the order run")
    fig.suptitle(title)
    return fig

"""The search map (minikv.hunt.figure): every text at least 8 pt where it is shown, nothing cut off or overlapping
(minikv.viz.legibility_problems), words in full (no abbreviated format names), and each panel's legend lists only
what that panel draws. Drawn from made-up reports the size of a real hunt's, so no engine runs here."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from minikv import viz  # noqa: E402
from minikv.hunt.figure import search_map  # noqa: E402
from minikv.hunt.oracles import Violation  # noqa: E402
from minikv.hunt.scenario import Request, Scenario  # noqa: E402
from minikv.hunt.search import Finding, HuntReport  # noqa: E402
from minikv.hunt.strategies import cells  # noqa: E402


def _report(n: int, refused_every: int = 0, found_at: int | None = None, shrink: int = 0) -> HuntReport:
    grid = cells()
    total = n + (found_at is not None) + shrink
    tried = [Scenario(*grid[i % len(grid)], requests=(Request("3 7 11", 1 + i % 3),)) for i in range(total)]
    refused = [s for i, s in enumerate(tried) if refused_every and i % refused_every == 0]
    finding = None
    if found_at is not None:
        s = tried[found_at]
        finding = Finding(s, [Violation("runs", "x")], "", (s.model, s.kv_cache_dtype, s.dtype), found_at, 1.0, shrink)
    return HuntReport(finding, len(tried), len(refused), 3, grid, 1.0, "finding" if finding else "scenarios",
                      tried=tried, refused_scenarios=refused)


def test_the_search_map_is_legible_and_its_legends_true():
    reports = {"the fixed engine": _report(118),
               "a defect, found": _report(20, refused_every=2, found_at=20, shrink=12),
               "found, not shrunk": _report(10, found_at=10)}
    fig = search_map(reports)
    fig.canvas.draw()
    assert viz.legibility_problems(fig) == []
    texts = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    assert texts and not any("_pth" in t for t in texts)
    for ax in fig.axes:
        drawn = {c.get_label() for c in ax.collections if len(c.get_offsets())}
        legend = {t.get_text() for t in ax.get_legend().get_texts()}
        assert legend == drawn, (legend, drawn)
    labels = {t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()}
    assert "run while shrinking the failure" not in {t.get_text() for t in fig.axes[2].get_legend().get_texts()}
    assert {"passed", "refused by the engine (outside its domain)", "first failing scenario"} <= labels

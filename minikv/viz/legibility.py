"""The legibility check every figure passes: each text drawn, its size as shown in a notebook at its real
width, and the texts that fall under the smallest legible size, overlap or leave the figure (tests/test_viz_legibility.py).
See docs/internals.md#viz-legibility."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .style import DPI, MIN_FONT_PT, SHOWN_WIDTH_PX

# ---- legibility -----------------------------------------------------------------------------------------------

def drawn_texts(fig: Figure, dpi: int = DPI) -> list[dict]:
    """Every piece of text the figure really draws, with its size and bounding box."""
    import io
    from unittest import mock

    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg

    found = []
    original = RendererAgg.draw_text

    def recording(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if s and s.strip():
            if mtext is not None:
                box = mtext.get_window_extent(self)
                bbox = (box.x0, box.y0, box.x1, box.y1)
            else:           # one line of a multi-line text: (x, y) is its baseline, y counted from the top
                w, h, d = self.get_text_width_height_descent(s, prop, ismath)
                base = self.height - y
                bbox = (x, base - d, x + w, base + h - d)
            clip = gc.get_clip_rectangle()
            clipped = clip is not None and not (clip.x0 - 1 <= bbox[0] and bbox[2] <= clip.x1 + 1
                                                and clip.y0 - 1 <= bbox[1] and bbox[3] <= clip.y1 + 1)
            found.append({"text": s, "points": prop.get_size_in_points(), "bbox": bbox, "clipped": clipped})
        return original(self, gc, x, y, s, prop, angle, ismath, mtext)

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    with mock.patch.object(RendererAgg, "draw_text", recording):
        canvas.print_figure(io.BytesIO(), format="png", dpi=dpi)
    return found


def legibility_problems(fig: Figure, shown_width_px: float = SHOWN_WIDTH_PX, min_pt: float = MIN_FONT_PT,
                        dpi: int = DPI) -> list[str]:
    """What makes a figure hard to read where it is shown; empty when every text is legible."""
    width_px, height_px = fig.get_figwidth() * dpi, fig.get_figheight() * dpi
    scale = min(1.0, shown_width_px / width_px)
    texts = drawn_texts(fig, dpi)
    problems = []
    for t in texts:
        shown = t["points"] * dpi / 96 * scale
        if shown < min_pt - 1e-6:
            problems.append(f"{t['text']!r}: {t['points']:g} pt shows as {shown:.1f} pt (< {min_pt:g}) at "
                            f"{min(width_px, shown_width_px):.0f} px wide")
        x0, y0, x1, y1 = t["bbox"]
        if x0 < -1 or y0 < -1 or x1 > width_px + 1 or y1 > height_px + 1:
            problems.append(f"{t['text']!r}: drawn past the figure's edge")
        if t["clipped"]:
            problems.append(f"{t['text']!r}: cut off by its axes")
    boxes = np.array([t["bbox"] for t in texts]).reshape(-1, 4)
    for i in range(len(texts)):
        a = boxes[i]
        ox = np.minimum(a[2], boxes[i + 1:, 2]) - np.maximum(a[0], boxes[i + 1:, 0])
        oy = np.minimum(a[3], boxes[i + 1:, 3]) - np.maximum(a[1], boxes[i + 1:, 1])
        for j in np.nonzero((ox > 1.0) & (oy > 1.0))[0]:
            problems.append(f"{texts[i]['text']!r} and {texts[i + 1 + j]['text']!r} overlap")
    return problems

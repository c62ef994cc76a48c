"""What every minikv figure shares: the colours (red is wrong and nothing else), the figure size and font
size a notebook shows legibly, and the small helpers the plots use to take lists, arrays or tensors alike.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

# Colour means one thing in every figure: red is WRONG and nothing else (a damaged request, a wiped scale, a block
# outside its pool); green is RIGHT. Neutral marks (a maximum, a reference line, a row's scale bytes) use the others.
RIGHT = "#4c9a2a"       # green: a correct request / a block inside its pool
WRONG = "#c0392b"       # red: a damaged request / a block outside its pool
NEUTRAL = "#333333"     # dark grey: a statistic or reference line that is neither right nor wrong
SCALE = "#d4a017"       # gold: the inline fp32 scale bytes of a row
EMPTY = "#eeeeee"
POOL_COLOURS = ("#4878a8", "#e8a33d", "#7a5aa6", "#3a9d8f", "#b5651d")
GUARD = "#999999"


# How the figures are shown: saved at DPI dots per inch (the notebooks' inline backend and the docs build both use
# 100), at most MAX_WIDTH_IN wide, for a content column SHOWN_WIDTH_PX wide (the figure plus the inline backend's
# tight-bbox margin; the docs site's column and JupyterLab's output area on a 1400-pixel window are wider), so that
# no figure is scaled down there. At that size no text may be smaller than MIN_FONT_PT (CSS points: a browser shows
# 96 pixels per inch). `legibility_problems` checks a figure against this.
DPI = 100
MAX_WIDTH_IN = 8.0
SHOWN_WIDTH_PX = 840
MIN_FONT_PT = 8.0
FONT = 8.0              # the smallest font size the figures use (8 pt at DPI 100 shows as 8.3 pt)


def new_figure(nrows: int = 1, ncols: int = 1, figsize=(7.0, 4.0), **kwargs) -> tuple[Figure, object]:
    width, height = figsize
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(width, MAX_WIDTH_IN), height), layout="constrained",
                             dpi=DPI, **kwargs)
    plt.close(fig)      # detach from pyplot: the caller owns the figure
    return fig, axes


def text_fits(ax, text: str, width: float, span: float, fontsize: float = FONT) -> bool:
    """Whether `text` fits into `width` of the `span` data units along ax's x extent (estimated from the figure's
    size: about 0.6 em per character)."""
    axes_px = ax.get_position().width * ax.figure.get_figwidth() * ax.figure.dpi
    return width / span * axes_px >= 0.62 * fontsize * ax.figure.dpi / 72 * len(text) + 2


def to_numpy(values, name: str, ndim: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Convert a list, array or torch tensor to a float64 NumPy array, checking its number of dimensions."""
    if hasattr(values, "detach"):                      # torch tensor, without importing torch here
        values = values.detach().to("cpu").float().numpy()
    array = np.asarray(values, dtype=np.float64)
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if allowed is not None and array.ndim not in allowed:
        raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimension(s), "
                         f"got shape {tuple(array.shape)}")
    return array


def as_token_head(scales, name: str) -> np.ndarray:
    """Scales as a [tokens, heads] matrix; [blocks, block_size, heads] views are flattened block by block."""
    array = to_numpy(scales, name, ndim=(1, 2, 3))
    if array.ndim == 1:
        return array[:, None]
    if array.ndim == 3:
        return array.reshape(-1, array.shape[-1])
    return array

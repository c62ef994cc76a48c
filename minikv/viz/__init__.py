"""The matplotlib figures the notebooks show, and their exercises' checks (`minikv.viz.exercises`).

Every function takes plain data (lists, NumPy arrays or torch tensors) and returns a new
`matplotlib.figure.Figure`. Nothing is shown and nothing is left behind in pyplot: each figure is created with
`plt.subplots` and then closed in pyplot, so it is drawn exactly once when a notebook cell returns it (the inline
backend does not also flush it) and a script can simply call `fig.savefig(...)`.

    fig = minikv.viz.request_grid(damaged, max_num_seqs=4)
    fig            # last expression of a notebook cell: shown once

Its modules: `style` (colours, sizes, shared helpers), `quantized` and `paged` (the figures of those notebooks),
`performance` (the bandwidth figure), `legibility` (the check every figure passes). Every name is importable
from `minikv.viz` itself.
"""
from __future__ import annotations

from .style import (DPI, EMPTY, FONT, GUARD, MAX_WIDTH_IN, MIN_FONT_PT, NEUTRAL, POOL_COLOURS, RIGHT,  # noqa: F401
                    SCALE, SHOWN_WIDTH_PX, WRONG, as_token_head, new_figure, text_fits, to_numpy)
from .legibility import drawn_texts, legibility_problems  # noqa: F401
from .quantized import (k_magnitude_plot, quant_error_plot, request_grid, row_layout_diagram,  # noqa: F401
                        scale_heatmap)
from .paged import (block_table_diagram, fragmentation_plot, layer_pool_diagram, pool_byte_map,  # noqa: F401
                    slot_mapping_diagram)
from .performance import bandwidth_plot  # noqa: F401

"""The matplotlib figures the notebooks show, and their exercises' checks (`minikv.viz.exercises`).
See docs/internals.md#viz."""
from __future__ import annotations

from .style import (DPI, EMPTY, FONT, GUARD, MAX_WIDTH_IN, MIN_FONT_PT, NEUTRAL, POOL_COLOURS, RIGHT,  # noqa: F401
                    SCALE, SHOWN_WIDTH_PX, WRONG, as_token_head, new_figure, text_fits, to_numpy)
from .legibility import drawn_texts, legibility_problems  # noqa: F401
from .quantized import (k_magnitude_plot, quant_error_plot, request_grid, row_layout_diagram,  # noqa: F401
                        scale_heatmap)
from .paged import (block_table_diagram, fragmentation_plot, layer_pool_diagram, pool_byte_map,  # noqa: F401
                    slot_mapping_diagram)
from .performance import bandwidth_plot  # noqa: F401

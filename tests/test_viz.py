"""minikv.viz: every figure function runs on small inputs and returns a Figure with axes, leaving pyplot empty."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from minikv import viz
from minikv.cache.arena import KVArena, PoolSpec
from minikv.cache.layout import KVLayout

RNG = np.random.default_rng(0)


def _texts(fig: Figure) -> str:
    """Every title and text drawn in the figure, for checking what it says."""
    parts = [t.get_text() for t in fig.texts]
    if fig._suptitle is not None:
        parts.append(fig._suptitle.get_text())
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_title(loc="left")] + [t.get_text() for t in ax.texts]
    return "\n".join(parts)


def _check(fig) -> Figure:
    assert isinstance(fig, Figure)
    assert fig.axes, "figure has no axes"
    assert plt.get_fignums() == [], "viz left a figure open in pyplot"
    fig.canvas.draw()          # renders without error
    return fig


def test_scale_heatmap_takes_views_and_marks_unwritten():
    before = torch.tensor(RNG.uniform(0.003, 0.01, (3, 8, 2)), dtype=torch.float32)   # [blocks, block, heads]
    after = before.clone().reshape(-1, 2)
    after[:10] = 1.0
    after[-2:] = 0.0                                                                   # never written
    fig = _check(viz.scale_heatmap(before, after, title="wipe"))
    assert "wipe" in _texts(fig)
    with pytest.raises(ValueError, match="same shape"):
        viz.scale_heatmap(before, after[:5])


def test_k_magnitude_plot_reports_the_inflation():
    k = RNG.normal(size=(12, 2, 16))
    fig = _check(viz.k_magnitude_plot(k, k * 200.0))
    assert "x200" in _texts(fig)
    assert fig.axes[0].get_yscale() == "log"


def test_request_grid_counts_wrong_requests():
    damaged = [i < 4 for i in range(10)]
    fig = _check(viz.request_grid(damaged, max_num_seqs=4))
    assert "4 of 10 wrong" in _texts(fig)
    with pytest.raises(ValueError, match="max_num_seqs"):
        viz.request_grid(damaged, max_num_seqs=0)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8_per_token_head", "fp8_per_token_head"])
def test_row_layout_diagram(kv_cache_dtype):
    layout = KVLayout(kv_cache_dtype, torch.float16, num_kv_heads=2, head_size=16, block_size=16)
    fig = _check(viz.row_layout_diagram(layout))
    text = _texts(fig)
    assert f"row: {layout.row_bytes} bytes" in text
    assert ("fp32 scale" in text) == layout.has_inline_scales
    assert ("per layer" in text) == (kv_cache_dtype == "fp8")
    with pytest.raises(TypeError, match="KVLayout"):
        viz.row_layout_diagram(object())


def test_quant_error_plot_handles_exact_formats():
    errors = {"auto": np.zeros(8), "fp8": RNG.uniform(0, 0.05, 64), "int8_per_token_head": 0.004}
    fig = _check(viz.quant_error_plot(errors))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list(errors)
    with pytest.raises(ValueError):
        viz.quant_error_plot({})


def test_block_table_diagram_counts_shared_blocks():
    fig = _check(viz.block_table_diagram([[0, 1, 2], [0, 1, 3, -1], [4]], num_blocks=8))
    text = _texts(fig)
    assert "5 of 8 blocks used, 2 shared" in text
    assert "labelled with its reference count" in text and "\n2\n" in text
    fig = _check(viz.block_table_diagram(torch.tensor([[0, 1], [2, -1]]), num_blocks=3))
    with pytest.raises(ValueError, match="only 3 blocks"):
        viz.block_table_diagram({"a": [0, 5]}, num_blocks=3)


def test_slot_mapping_diagram_skips_unwritten_slots():
    fig = _check(viz.slot_mapping_diagram(torch.tensor([16, 17, -1, 40]), block_size=16,
                                          token_labels=["a", "b", "pad", "c"]))
    assert "3 token(s) written, 1 with slot -1" in _texts(fig)
    with pytest.raises(ValueError, match="token_labels"):
        viz.slot_mapping_diagram([1, 2], block_size=16, token_labels=["a"])


def test_fragmentation_plot_waste_totals():
    fig = _check(viz.fragmentation_plot([5, 17, 32], block_size=16, max_seq_len=64))
    # contiguous: 3 * 64 - 54 = 138 wasted; paged: 16 + 32 + 32 - 54 = 26 wasted
    assert "contiguous 138, paged 26" in _texts(fig)
    with pytest.raises(ValueError):
        viz.fragmentation_plot([100], block_size=16, max_seq_len=64)


def test_pool_byte_map_flags_blocks_outside_the_pool():
    layout = KVLayout("fp8", torch.float16, num_kv_heads=2, head_size=32, block_size=16)
    arena = KVArena([PoolSpec("self", layout, 4), PoolSpec("cross", layout, 4)], reach_elem_bytes=2)
    start, size = arena.offsets["cross"], layout.block_bytes
    correct = [(start + b * size, start + (b + 1) * size) for b in range(4)]
    doubled = [(start + 2 * b * size, start + 2 * (b + 1) * size) for b in range(4)]
    fig = _check(viz.pool_byte_map(arena.byte_map(), correct, doubled, pool="cross"))
    text = _texts(fig)
    assert "correct stride: 0 of 4 outside" in text
    assert "doubled stride: 2 of 4 outside" in text
    with pytest.raises(ValueError, match="unknown pool"):
        viz.pool_byte_map(arena.byte_map(), correct, doubled, pool="nope")


def test_bandwidth_plot_accepts_dicts_and_pairs():
    fig = _check(viz.bandwidth_plot([{"label": "decode auto", "gbps": 3000.0}, ("decode int8", 2400)],
                                    copy_gbps=4000.0))
    assert "75%" in _texts(fig)
    with pytest.raises(ValueError, match="label"):
        viz.bandwidth_plot([{"gbps": 1.0}], copy_gbps=1.0)

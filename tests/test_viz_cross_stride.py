"""minikv.viz.cross_stride: the defect-B figures take plain data, colour wrong things red, refuse bad input, and
the code-site diff is generated from the source (historical -> fixed)."""
from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

matplotlib.use("Agg")

from minikv.viz import cross_stride as vcs  # noqa: E402
from minikv.attention.cross import CrossAttentionImpl, CrossAttentionModule  # noqa: E402
from minikv.viz import RIGHT, WRONG  # noqa: E402

KB = 1024
REGIONS = [("guard", "<arena start>", 0, 4 * KB), ("pool", "cross.decoder.0.cross_attn", 4 * KB, 12 * KB),
           ("guard", "cross.decoder.0.cross_attn", 12 * KB, 16 * KB),
           ("pool", "kv.decoder.0.self_attn", 16 * KB, 64 * KB), ("guard", "kv.decoder.0.self_attn", 64 * KB, 68 * KB)]


def panel(doubled, wrong=()):
    return {"title": "test", "regions": REGIONS, "doubled": {"cross.decoder.0.cross_attn": doubled},
            "self_blocks": [(16 * KB, 20 * KB, 0), (20 * KB, 24 * KB, 1)], "wrong": list(wrong)}


def face_colours(fig):
    return [to_hex(p.get_facecolor()) for ax in fig.axes for p in ax.patches]


def edge_colours(fig):
    return [to_hex(p.get_edgecolor()) for ax in fig.axes for p in ax.patches]


def test_stride_byte_map_marks_blocks_outside_their_pool_red_and_the_self_blocks_they_cover():
    inside = panel([(4 * KB, 8 * KB, 0), (8 * KB, 12 * KB, 1)])
    outside = panel([(4 * KB, 8 * KB, 0), (12 * KB, 20 * KB, 1)], wrong=[0])
    fig = vcs.stride_byte_map([inside, outside], x_max=40 * KB)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    top, bottom = fig.axes
    assert to_hex(WRONG) not in [to_hex(p.get_facecolor()) for p in top.patches]
    assert [to_hex(p.get_facecolor()) for p in bottom.patches].count(to_hex(WRONG)) == 1
    # The stray block covers self-attention block 0 (16-20 KiB), not block 1: one red outline.
    assert [to_hex(p.get_edgecolor()) for p in bottom.patches].count(to_hex(WRONG)) == 1
    assert top.get_xlim() == bottom.get_xlim() == (0.0, 40.0)
    assert "wrong requests: 0" in bottom.get_title(loc="left")


def test_stride_byte_map_draws_a_landing_in_a_guard_zone_apart_from_one_in_a_live_pool():
    """A block whose overhang ends in the guard zone damages nothing: no red, and no self block outlined."""
    into_guard = panel([(8 * KB, 16 * KB, 0)])
    fig = vcs.stride_byte_map([into_guard], x_max=40 * KB)
    (ax,) = fig.axes
    assert to_hex(WRONG) not in face_colours(fig) and to_hex(WRONG) not in edge_colours(fig)
    dotted = [p for p in ax.patches if p.get_hatch() == vcs.LANDING_STYLE["guard"]["hatch"]]
    assert len(dotted) == 1 and dotted[0].get_x() == 12.0 and dotted[0].get_width() == 4.0
    assert vcs.landing_segments(8 * KB, 20 * KB, "cross.decoder.0.cross_attn", REGIONS) == [
        (8 * KB, 12 * KB, "own"), (12 * KB, 16 * KB, "guard"), (16 * KB, 20 * KB, "live")]


def test_stride_byte_map_refuses_bad_panels():
    with pytest.raises(ValueError, match="panels is empty"):
        vcs.stride_byte_map([])
    with pytest.raises(ValueError, match="missing"):
        vcs.stride_byte_map([{"title": "x", "regions": REGIONS}])
    bad = panel([]) | {"regions": [("heap", "x", 0, 1)]}
    with pytest.raises(ValueError, match="'pool' or 'guard'"):
        vcs.stride_byte_map([bad])


def test_fp8_row_as_16bit_counts_the_wrong_elements():
    fp8 = torch.tensor([1.0, -2.0, 0.5, 4.0])
    raw = torch.arange(8, dtype=torch.uint8)
    read = torch.tensor([1.0, 7.0, float("nan"), 4.0])
    fig = vcs.fp8_row_as_16bit(raw, fp8, read)
    assert isinstance(fig, Figure)
    assert "2 of 4 elements decoded wrong" in fig.axes[1].get_title()
    boxes = [to_hex(p.get_facecolor()) for p in fig.axes[0].patches]     # per line: 4 bytes, then 2 elements
    assert boxes[4:6] + boxes[10:12] == [to_hex(RIGHT), to_hex(WRONG), to_hex(WRONG), to_hex(RIGHT)]
    with pytest.raises(ValueError, match="2 x head_size"):
        vcs.fp8_row_as_16bit(raw[:6], fp8, read)


def test_output_scatter_is_red_only_off_the_diagonal():
    exact = torch.linspace(-1, 1, 50)
    right = list(zip(exact.tolist(), (exact + 1e-4).tolist()))
    wrong = list(zip(exact.tolist(), (exact * -3).tolist()))
    fig = vcs.output_scatter({"fixed": right, "historical": wrong})
    assert "0 of 50 elements off" in fig.axes[0].get_title()
    assert "\n50 of 50 elements off" in fig.axes[1].get_title()
    red = [c for c in fig.axes[1].collections if len(c.get_offsets()) and to_hex(c.get_facecolor()[0]) == to_hex(WRONG)]
    assert len(red) == 1 and len(red[0].get_offsets()) == 50
    with pytest.raises(ValueError, match="samples is empty"):
        vcs.output_scatter({})
    with pytest.raises(ValueError, match="pairs"):
        vcs.output_scatter({"x": [[1.0, 2.0, 3.0]]})


def test_code_site_diff_is_the_historical_to_fixed_change_of_each_site():
    init = vcs.code_site_diff(CrossAttentionModule.__init__)
    assert "-        self.backend = create_attention(*shape)" in init
    assert "+        self.backend = create_attention(*shape, quant_config=self.quant_config)" in init
    weights = vcs.code_site_diff(CrossAttentionModule.create_weights)
    assert "+        self.backend.update_quant_config(self.quant_config)" in weights
    read = vcs.code_site_diff(CrossAttentionImpl._context_read_layout)
    assert "-        if not self.paged_context:" in read and "-            return sixteen_bit_read_of(self.layout)" in read
    assert "historical_context_read" not in read            # the reintroduce switch is not part of either version


def test_site_versions_needs_a_historical_site():
    with pytest.raises(ValueError, match="HISTORICAL"):
        vcs.site_versions("def f():\n    return 1\n")
    src = "def f(x):\n    if x.historical:\n        # HISTORICAL\n        return 1\n    else:\n        # FIX\n" \
          "        return 2\n"
    historical, fixed = vcs.site_versions(src)
    assert historical == ["def f(x):", "    # HISTORICAL", "    return 1"]
    assert fixed == ["def f(x):", "    # FIX", "    return 2"]

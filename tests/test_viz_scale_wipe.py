"""minikv.viz.scale_wipe and the data behind it (minikv.repro.scale_wipe_trace): the figures draw what a real run
did, and the trace says what the picture story claims (which layers wipe, which read wiped rows, when)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from minikv import viz
from minikv.viz import scale_wipe as viz_scale_wipe
from minikv.repro import scale_wipe, scale_wipe_trace


def _check(fig) -> Figure:
    assert isinstance(fig, Figure) and fig.axes
    assert plt.get_fignums() == [], "left a figure open in pyplot"
    fig.canvas.draw()
    return fig


def _texts(fig: Figure) -> str:
    parts = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_title(loc="left")] + [t.get_text() for t in ax.texts]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def prompts():
    return scale_wipe.make_prompts(8)


@pytest.fixture(scope="module")
def timelines(prompts):
    return {buggy: scale_wipe_trace.trace_run(scale_wipe_trace.engine(buggy), prompts, max_tokens=3)[0]
            for buggy in (True, False)}


def test_timeline_says_who_wipes_and_who_reads_wiped_rows(timelines):
    buggy, fixed = timelines[True], timelines[False]
    assert buggy.buggy and not fixed.buggy
    assert buggy.columns[:2] == ["warmup", "step 0"] and buggy.phases["step 0"] == "prefill"
    # Warmup: the owners fill, the sharers do nothing.
    assert [buggy.events(layer, "warmup") for layer in range(8)] == [["fill"]] * 4 + [[]] * 4
    # Step 0: owners write then read their own rows; the first sharer of each storage wipes, the second fills
    # harmlessly; every sharer then reads wiped rows.
    assert buggy.events(2, "step 0") == ["write", "read"]
    assert buggy.events(4, "step 0") == ["wipe", "read wiped"]
    assert buggy.events(6, "step 0") == ["fill", "read wiped"]
    # Decode steps of the first batch: layers 2 and 3 read their own (wiped) storage too; the next batch is clean.
    wiped = buggy.reads_wiped()
    assert sorted(wiped) == [2, 3, 4, 5, 6, 7]
    assert wiped[2] == ["step 1", "step 2"] and wiped[4] == ["step 0", "step 1", "step 2"]
    assert fixed.reads_wiped() == {}
    assert all("wipe" not in fixed.events(layer, c) for layer in range(8) for c in fixed.columns)


def test_timeline_figures_colour_wrong_cells_red(timelines):
    fig = _check(viz_scale_wipe.timeline_figure(timelines[True], timelines[False]))
    assert len(fig.axes) == 2
    assert "F!" in _texts(fig) and "R!" in _texts(fig)
    buggy_image = fig.axes[0].images[0]
    colours = {to_hex(c) for c in buggy_image.cmap(buggy_image.norm(buggy_image.get_array().ravel()))}
    assert viz.WRONG in colours
    fixed_image = fig.axes[1].images[0]
    assert viz.WRONG not in {to_hex(c) for c in fixed_image.cmap(fixed_image.norm(fixed_image.get_array().ravel()))}
    _check(viz_scale_wipe.wiped_reads_figure(timelines[True]))
    with pytest.raises(ValueError):
        viz_scale_wipe.timeline_figure()


def test_causal_chain_follows_one_request(prompts):
    chain = scale_wipe_trace.causal_chain(prompts, request=0, layer=4, head=0, max_tokens=6)
    assert chain.storage == "model.layers.2.self_attn"
    assert chain.k_fixed.shape == chain.k_buggy.shape
    assert float(chain.k_buggy.abs().amax()) > 5 * float(chain.k_fixed.abs().amax())
    # The same query over the wiped keys concentrates its weight on fewer keys.
    assert float(chain.attn_buggy.max()) > float(chain.attn_fixed.max())
    assert torch.isclose(chain.attn_buggy.sum(), torch.tensor(1.0)) and torch.isclose(chain.attn_fixed.sum(),
                                                                                     torch.tensor(1.0))
    assert chain.chosen_fixed != chain.chosen_buggy
    assert chain.top_fixed[0][0] == chain.chosen_fixed and chain.top_buggy[0][0] == chain.chosen_buggy
    assert chain.text_fixed[:chain.diverging_step] == chain.text_buggy[:chain.diverging_step]
    fig = _check(viz_scale_wipe.causal_chain_figure(chain, "x46"))
    assert "x46" in _texts(fig) and len(fig.axes) == 4
    assert chain.tokens_fixed[:chain.diverging_step] == chain.tokens_buggy[:chain.diverging_step]
    assert chain.tokens_fixed[chain.diverging_step] != chain.tokens_buggy[chain.diverging_step]
    assert f"they part at token {chain.diverging_step}" in _texts(fig)
    with pytest.raises(ValueError, match="owns its KV cache"):
        scale_wipe_trace.causal_chain(prompts, layer=2)


def test_prefix_sources_and_grid():
    class Out:            # the StepOutput fields prefix_sources reads
        def __init__(self, ids, tables, cached):
            self.is_prefill, self.request_ids, self.block_tables, self.num_cached_tokens = True, ids, tables, cached
    outs = [Out((0, 1), {0: (0, 1, 2), 1: (3, 4)}, {0: 0, 1: 0}), Out((2,), {2: (0, 1, 5)}, {2: 32})]
    assert scale_wipe_trace.prefix_sources(outs, 16) == {2: 0}
    fig = _check(viz_scale_wipe.request_sources_grid([True, False, True], 2, {2: 0}, title="t"))
    assert "from 0" in _texts(fig) and "2 of 3 wrong" in _texts(fig)
    with pytest.raises(ValueError):
        viz_scale_wipe.request_sources_grid([True], 2, {3: 0})
    with pytest.raises(ValueError):
        viz_scale_wipe.request_sources_grid([], 2, {})

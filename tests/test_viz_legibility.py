"""Every figure the notebooks and the docs show is legible at the size it is shown.

Each figure function of minikv.viz and its scale_wipe, cross_stride and gpu modules is drawn here with inputs the
size of the notebooks' (the GPU figures with the committed CSV itself), and `minikv.viz.legibility_problems` must
find nothing: no text smaller than 8 pt where the figure is shown (its own width, or the site's column of
SHOWN_WIDTH_PX if it were wider; no figure is), none cut off by the figure's edge or its axes, no two texts drawn
over each other. A figure function nobody registered here fails the test, so a new figure is checked too.
tests/test_browser_lab.py checks that the site really shows every figure at that width.
"""
from __future__ import annotations

import csv
import inspect
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

matplotlib.use("Agg")

from minikv import viz
from minikv.viz import cross_stride as viz_cross_stride
from minikv.viz import gpu as viz_gpu
from minikv.viz import scale_wipe as viz_scale_wipe
from minikv.cache.layout import KVLayout
from minikv.repro.cross_stride_trace import CrossCausalChain, CrossTimeline
from minikv.repro.scale_wipe_trace import CausalChain, StorageMap, Timeline

REPO = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(0)
KB = 1024


def _number(value: str):
    try:
        return float(value)
    except ValueError:
        return value


def _gpu_rows(name: str = "gpu_attention.csv"):
    """The rows of notebook 05's CSV as its `load` reads them (numbers as floats; text columns, new ones too, kept)."""
    with open(REPO / "notebooks" / "data" / name) as f:
        return [{k: (v if v == "" else _number(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def _timeline(buggy: bool) -> Timeline:
    columns = ["warmup"] + [f"step {i}" for i in range(8)]
    t = Timeline(buggy, 8, columns, phases={c: ("prefill" if c in ("step 0", "step 4") else "decode")
                                            for c in columns[1:]},
                 storages={4: 2, 5: 3, 6: 2, 7: 3})
    for layer in range(8):
        t.cells[(layer, "warmup")] = ["fill"] if layer < 4 else []
        for i in range(8):
            wiped = buggy and i < 4
            if layer < 4:
                t.cells[(layer, f"step {i}")] = ["write", "read wiped" if wiped and layer in (2, 3) and i else "read"]
            else:
                first = ["wipe" if layer in (4, 5) else "fill"] if buggy and i == 0 else []
                t.cells[(layer, f"step {i}")] = first + ["read wiped" if wiped else "read"]
    return t


def _chain() -> CausalChain:
    k = torch.tensor(RNG.normal(size=(47, 2, 32)), dtype=torch.float32)
    attn = torch.softmax(torch.tensor(RNG.normal(size=47)), 0)
    top = [(" ", 12.9), ("", 0.08), ("1", -0.16), ("0", -1.8), ("9", -2.2)]
    return CausalChain(0, "model.layers.4.self_attn", "model.layers.2.self_attn", 0, k, k * 40, attn,
                       torch.nn.functional.one_hot(torch.tensor(32), 47).float(), 5, top,
                       [("4", 7.0), (" ", 4.3), ("5", 3.5), ("3", 3.0), ("", 2.2)], " ", "4", " 1226 1294 1",
                       " 12264 16 16", list(" 1226 1294 1"), list(" 12264 16 16"))


def _storage_map() -> StorageMap:
    blocks = [(b, r, 16, 16) for r, bs in enumerate([(0, 1, 2), (3, 4, 5, 6, 7), (8, 9, 10, 11, 12), (13, 14, 15, 16, 17)])
              for b in bs]
    storages = [{"pool": f"kv.model.layers.{i}.self_attn", "owner": i, "readers": [] if i < 2 else [i + 2, i + 4],
                 "wiped_by": None if i < 2 else i + 2,
                 "blocks": [(b, r, n, 0 if i < 2 else w) for b, r, n, w in blocks]} for i in range(4)]
    layout = KVLayout("int8_per_token_head", torch.float32, 2, 32, 16)
    return StorageMap(0, storages, 64, layout, ("kv.model.layers.2.self_attn", 0, 0, [(o, True, True)
                                                                                      for o in range(16)]))


def _byte_panels():
    panels = []
    for factor, blocks in ((1.0, 10), (1.5, 15), (2.0, 20)):
        pool = blocks * 4 * KB
        regions, at, starts = [("guard", "<arena start>", 0, 4 * KB)], 4 * KB, {}
        for name in ("cross.decoder.0.cross_attn", "cross.decoder.1.cross_attn", "cross.decoder.2.cross_attn",
                     "kv.decoder.0.self_attn"):
            size = pool if name.startswith("cross") else 64 * 4 * KB
            regions += [("pool", name, at, at + size), ("guard", name, at + size, at + size + 4 * KB)]
            starts[name] = at
            at += size + 4 * KB
        owners = [0, 1, 1, 1, 2, 3, 3, 4, 5, 5]
        doubled = {name: [(starts[name] + 8 * KB * b, starts[name] + 8 * KB * (b + 1), r) for b, r in enumerate(owners)]
                   for name in starts if name.startswith("cross")}
        self_blocks = [(starts["kv.decoder.0.self_attn"] + 4 * KB * r, starts["kv.decoder.0.self_attn"] + 4 * KB * (r + 1), r)
                       for r in range(6)]
        panels.append({"title": f"{factor:g}x: {blocks} blocks per cross pool (10 needed)", "regions": regions,
                       "doubled": doubled, "self_blocks": self_blocks, "wrong": [0, 1, 2, 3, 5]})
    return panels


def _cross_timeline(buggy: bool) -> CrossTimeline:
    layers = [f"decoder.{i}.{kind}_attn" for i in range(3) for kind in ("self", "cross")]
    columns = [f"step {i}" for i in range(8)]
    t = CrossTimeline(buggy, layers, columns, phases={c: "prefill" if c == "step 0" else "decode" for c in columns},
                      wrong=[0, 1, 2, 3, 5] if buggy else [], title="1.5x pool, historical stride")
    for layer in layers:
        for i, c in enumerate(columns):
            if "self" in layer:
                hit = buggy and i and layer.startswith("decoder.0")
                t.cells[(layer, c)] = ["write", "read overwritten" if hit else "read"]
                if hit:
                    t.victims[(layer, c)] = [0, 1, 2, 3]
            else:
                t.cells[(layer, c)] = (["write stray" if buggy else "write"] if i == 0 else []) + (
                    ["read overwritten"] if buggy and i else ["read"])
                if buggy and i:
                    t.victims[(layer, c)] = [5]
    return t


def _cross_chain() -> CrossCausalChain:
    start, end = 135168, 196608
    doubled = [(b, r, start + 4096 * b, start + 4096 * (b + 1), start + 8192 * b, start + 8192 * (b + 1))
               for b, r in enumerate([0, 1, 1, 1, 2, 3, 3, 4, 5, 5])]
    return CrossCausalChain(0, "decoder.2.cross_attn", "decoder.0.self_attn", start, end, doubled,
                            [(0, 200704, 204800)], [(0, True, True)], list("46cghvw"), list("4aw26awe"), 1,
                            ("decoder.0.self_attn", "step 1"), 1.5, 15)


def _fp8_row():
    raw = torch.tensor(RNG.integers(0, 256, 64), dtype=torch.uint8)
    values = raw[:32].clone().view(torch.float8_e4m3fn).float().nan_to_num(0.0)
    return raw, values, raw.view(torch.float16).float()


FIGURES = {
    "viz.scale_heatmap": lambda: viz.scale_heatmap(RNG.uniform(0.003, 0.01, (64, 2)), np.ones((64, 2)),
                                                   title="Layer 2's storage: K scales of the first batch's prompt tokens",
                                                   labels=("written by layer 2 (census snapshot)",
                                                           "after layer 4's late fill")),
    "viz.k_magnitude_plot": lambda: viz.k_magnitude_plot(RNG.normal(size=(47, 2, 32)), RNG.normal(size=(47, 2, 32)) * 40),
    "viz.request_grid": lambda: viz.request_grid([i < 4 for i in range(24)], 4, title="Buggy engine"),
    "viz.row_layout_diagram": lambda: viz.row_layout_diagram(KVLayout("int8_per_token_head", torch.float32, 2, 32, 16)),
    "viz.quant_error_plot": lambda: viz.quant_error_plot(
        {"fp8, scale 1": RNG.uniform(0, 0.1, 99), "fp8, calibrated": RNG.uniform(0, 0.1, 99),
         "int8 per tensor*": RNG.uniform(0, 0.01, 99), "int8_per_token_head": RNG.uniform(0, 0.004, 99),
         "fp8_per_token_head": RNG.uniform(0, 0.03, 99)},
        title="Layer 0 K with one outlier token (x20): error of the other tokens"),
    "viz.block_table_diagram": lambda: viz.block_table_diagram(
        {"A (40 tokens)": [0, 1, 2], "B (55 tokens)": [0, 1, 3, 4]}, 10, title="Prefix caching: B reuses A's two full blocks"),
    "viz.slot_mapping_diagram": lambda: viz.slot_mapping_diagram(
        list(range(14)) + list(range(16, 37)) + list(range(48, 57)) + list(range(64, 94)), 16,
        token_labels=(["B"] + list("3 7 11 15 19") + ["·"] * 80)[:74], requests=[0] * 14 + [1] * 21 + [2] * 9 + [3] * 30,
        key="a cell's label: the prompt character whose K/V is written there (B: the BOS token, ·: a space)",
        title="Prefill: where each prompt character's K/V is written"),
    "viz.layer_pool_diagram": lambda: viz.layer_pool_diagram({i: i if i < 4 else 2 + i % 2 for i in range(8)},
                                                             ["sliding_attention", "full_attention"] * 4),
    "viz.fragmentation_plot": lambda: viz.fragmentation_plot(list(RNG.integers(20, 60, 16)), 16, 128,
                                                             title="16 ragged requests: KV slots reserved per request"),
    "viz.pool_byte_map": lambda: viz.pool_byte_map(_byte_panels()[1]["regions"], [(4 * KB, 8 * KB)],
                                                   [(4 * KB, 12 * KB)], pool="cross.decoder.0.cross_attn"),
    "viz.bandwidth_plot": lambda: viz.bandwidth_plot([("decode auto", 3000.0), ("decode int8", 2400.0)], 4000.0),
    "viz.scale_wipe.timeline_figure": lambda: viz_scale_wipe.timeline_figure(_timeline(True), _timeline(False)),
    "viz.scale_wipe.wiped_reads_figure": lambda: viz_scale_wipe.wiped_reads_figure(_timeline(True)),
    "viz.scale_wipe.causal_chain_figure": lambda: viz_scale_wipe.causal_chain_figure(_chain(), "x41"),
    "viz.scale_wipe.storage_byte_map": lambda: viz_scale_wipe.storage_byte_map(_storage_map()),
    "viz.scale_wipe.request_sources_grid": lambda: viz_scale_wipe.request_sources_grid(
        [i in (0, 1, 2, 3, 8, 9, 10, 11) for i in range(12)], 4, {8: 0, 9: 1, 10: 2, 11: 3},
        title="Buggy, prefix caching"),
    "viz.cross_stride.stride_byte_map": lambda: viz_cross_stride.stride_byte_map(_byte_panels()),
    "viz.cross_stride.fp8_row_as_16bit": lambda: viz_cross_stride.fp8_row_as_16bit(*_fp8_row()),
    "viz.cross_stride.output_scatter": lambda: viz_cross_stride.output_scatter(
        {f"{v} ({p})": list(zip(RNG.normal(size=200), RNG.normal(size=200) * s))
         for v, p, s in (("historical", "fused", 5), ("fallback", "unfused", 1), ("taught-fused", "fused", 1))}),
    "viz.cross_stride.cross_timeline_figure": lambda: viz_cross_stride.cross_timeline_figure(_cross_timeline(True),
                                                                                             _cross_timeline(False)),
    "viz.cross_stride.cross_causal_chain_figure": lambda: viz_cross_stride.cross_causal_chain_figure(_cross_chain()),
    "viz.gpu.bandwidth_figure": lambda: viz_gpu.bandwidth_figure(_gpu_rows()),
    "viz.gpu.roofline_figure": lambda: viz_gpu.roofline_figure(_gpu_rows()),
    "viz.gpu.roofline_bars_figure": lambda: viz_gpu.roofline_bars_figure(_gpu_rows(), [(64, 4096), (16, 16384),
                                                                                        (256, 16384)]),
    "viz.gpu.sdpa_ratio_figure": lambda: viz_gpu.sdpa_ratio_figure(_gpu_rows()),
    "viz.gpu.peer_figure": lambda: viz_gpu.peer_figure(_gpu_rows()),
    "viz.gpu.engine_context_figure": lambda: viz_gpu.engine_context_figure(_gpu_rows()),
    "viz.gpu.capacity_figure": lambda: viz_gpu.capacity_figure(_gpu_rows("gpu_attention.csv")),
}


def _figure_functions() -> set[str]:
    found = set()
    for module in (viz, viz_scale_wipe, viz_cross_stride, viz_gpu):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ in (module.__name__, f"{module.__name__}.{fn.__module__.rpartition('.')[2]}") and \
                    not name.startswith("_") and \
                    inspect.signature(fn).return_annotation in (Figure, "Figure"):
                found.add(f"{module.__name__.removeprefix('minikv.')}.{name}")
    return found


def test_every_figure_function_is_checked():
    assert _figure_functions() == set(FIGURES), (
        f"figure functions not registered here: {sorted(_figure_functions() - set(FIGURES))}; "
        f"registered but gone: {sorted(set(FIGURES) - _figure_functions())}")


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_is_legible_where_it_is_shown(name):
    fig = FIGURES[name]()
    assert fig.get_figwidth() <= viz.MAX_WIDTH_IN + 1e-6, f"{name}: {fig.get_figwidth()} in wide"
    problems = viz.legibility_problems(fig)
    assert not problems, f"{name}:\n" + "\n".join(problems[:20])


def test_legibility_check_catches_small_overlapping_and_cut_off_text():
    """The check itself must fail on what makes a figure unreadable, or the tests above could never fail."""
    fig, ax = viz.new_figure(figsize=(4.0, 3.0))
    ax.text(0.5, 0.5, "tiny", fontsize=5)
    ax.text(0.1, 0.1, "first label", fontsize=9)
    ax.text(0.12, 0.1, "second label", fontsize=9)
    ax.text(0.98, 0.9, "a label that runs past the axes", fontsize=9, clip_on=True)
    problems = "\n".join(viz.legibility_problems(fig))
    assert "'tiny': 5 pt" in problems
    assert "'first label' and 'second label' overlap" in problems
    assert "cut off" in problems or "past the figure's edge" in problems
    wide, _ = viz.new_figure(figsize=(8.0, 2.0))
    wide.text(0.5, 0.5, "8 points", fontsize=8)
    assert viz.legibility_problems(wide) == []
    assert viz.legibility_problems(wide, shown_width_px=400)      # shown at half the width: 4 pt

"""The benchmark's target lines: the verdict compares the unrounded ratio, and the printed ratio is rounded down, so a
line never reads "MISSED 0.750x (target 0.75x)". Pure Python on hand-made rows: no GPU."""
from __future__ import annotations

import pytest

from minikv.bench.attention import format_ratio, format_targets


def _prefill(paged_tflops: float) -> list[dict]:
    return [{"kind": "prefill", "format": "self causal, torch SDPA", "TFLOPs": 1000.0},
            {"kind": "prefill", "format": "self causal, paged bf16 (fused)", "TFLOPs": paged_tflops}]


@pytest.mark.parametrize("value, text", [(0.6996, "0.699x"), (0.7, "0.700x"), (1.2049, "1.204x"), (1.7, "1.700x")])
def test_ratio_is_rounded_down(value, text):
    assert format_ratio(value) == text


@pytest.mark.parametrize("tflops, line", [(749.6, "MISSED  0.749x (target 0.75x)"), (750.0, "met     0.750x (target 0.75x)"),
                                          (750.4, "met     0.750x (target 0.75x)")])
def test_verdict_and_printed_ratio_agree(tflops, line):
    (printed,) = format_targets(_prefill(tflops))
    assert printed.startswith(line), printed


def test_per_token_head_targets_name_the_default_placement():
    """Each placement has its own goals; the line of the placement that is not the engine's default says so."""
    from minikv.bench.attention import default_placement, targets
    rows = [{"kind": "decode", "format": f, "batch": 64, "context": 4096, "ms": 1.0, "sdpa_over_minikv": 1.0}
            for f in ("auto", "int8_per_token_head", "int8_per_token_head/block")]
    lines = [what for what, _, _ in targets(rows)]
    other = "int8_per_token_head/block" if default_placement() == "row" else "int8_per_token_head"
    marked = [w for w in lines if w.endswith("(other placement)")]
    assert len(marked) == 1 and all(w.startswith(f"{other} vs bf16") for w in marked)
    assert f"{other} vs bf16 paged decode, batch 64, context 4096 (other placement)" in marked


def test_placements_have_their_own_goals():
    """Row placement: 1.3x at batch 64 / context 4096 and 1.2x at every batch >= 16, context >= 4096; block: 1.6x."""
    from minikv.bench.attention import targets
    rows = [{"kind": "decode", "format": f, "batch": b, "context": c, "ms": ms, "sdpa_over_minikv": 1.0}
            for b, c in ((16, 4096), (64, 4096)) for f, ms in (("auto", 1.0), ("int8_per_token_head", 0.8),
                                                                 ("int8_per_token_head/block", 0.6))]
    got = {what: (round(value, 3), goal) for what, value, goal in targets(rows)}
    row = [v for w, v in got.items() if w.startswith("int8_per_token_head vs")]
    block = [v for w, v in got.items() if w.startswith("int8_per_token_head/block vs")]
    assert sorted(row) == [(1.25, 1.2), (1.25, 1.3)] and block == [(1.667, 1.6)]

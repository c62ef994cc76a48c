"""The benchmark's target lines (issue 14 item 6, targets of issue 20): the verdict compares the unrounded ratio, and
the printed ratio is rounded down, so a line never reads "MISSED 0.750x (target 0.75x)". Pure Python on hand-made
rows: no GPU."""
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
    """The 1.7x / 1.5x targets are for the engine's default placement; the other placement's lines say so."""
    from minikv.bench.attention import default_placement, targets
    rows = [{"kind": "decode", "format": f, "batch": 64, "context": 4096, "ms": 1.0, "sdpa_over_minikv": 1.0}
            for f in ("auto", "int8_per_token_head", "int8_per_token_head/block")]
    lines = [what for what, _, _ in targets(rows)]
    other = "int8_per_token_head/block" if default_placement() == "row" else "int8_per_token_head"
    marked = [w for w in lines if w.endswith("(other placement)")]
    assert len(marked) == 2 and all(w.startswith(f"{other} vs bf16") for w in marked)
    assert f"{other} vs bf16 paged decode, batch 64, context 4096 (other placement)" in marked

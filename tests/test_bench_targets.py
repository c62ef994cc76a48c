"""The benchmark's target lines (issue 14 item 6): the verdict compares the unrounded ratio, and the printed ratio is
rounded down, so a line never reads "MISSED 0.700x (target 0.70x)". Pure Python on hand-made rows: no GPU."""
from __future__ import annotations

import pytest

from minikv.bench.attention import format_ratio, format_targets


def _prefill(paged_tflops: float) -> list[dict]:
    return [{"kind": "prefill", "format": "self causal, torch SDPA", "TFLOPs": 1000.0},
            {"kind": "prefill", "format": "self causal, paged bf16 (fused)", "TFLOPs": paged_tflops}]


@pytest.mark.parametrize("value, text", [(0.6996, "0.699x"), (0.7, "0.700x"), (1.2049, "1.204x"), (1.7, "1.700x")])
def test_ratio_is_rounded_down(value, text):
    assert format_ratio(value) == text


@pytest.mark.parametrize("tflops, line", [(699.6, "MISSED  0.699x (target 0.70x)"), (700.0, "met     0.700x (target 0.70x)"),
                                          (700.4, "met     0.700x (target 0.70x)")])
def test_verdict_and_printed_ratio_agree(tflops, line):
    (printed,) = format_targets(_prefill(tflops))
    assert printed.startswith(line), printed

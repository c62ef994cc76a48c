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


@pytest.mark.parametrize("tflops, line", [(899.6, "MISSED  0.899x (target 0.90x)"), (900.0, "met     0.900x (target 0.90x)"),
                                          (900.4, "met     0.900x (target 0.90x)")])
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


def _cross(batch, q_len, enc, fused_ms, unfused_ms, engine_path=None) -> list[dict]:
    """The two cross-context rows of one shape, as the CSV gives them back (strings; "" where a row has no value)."""
    fused = {"kind": "cross-context", "format": "cross, fp8 paged (fused, taught)", "batch": str(batch),
             "q_len": str(q_len), "context": str(enc), "ms": str(fused_ms),
             "unfused_over_fused": str(unfused_ms / fused_ms)}
    unfused = dict(fused, format="cross, bf16 workspace (unfused)", ms=str(unfused_ms))
    if engine_path is not None:
        engine_ms = fused_ms if engine_path == "fused" else unfused_ms
        fused.update(engine_path=engine_path, unfused_over_engine=str(unfused_ms / engine_ms))
        unfused.update(engine_path="", unfused_over_engine="")
    return [fused, unfused]


def test_cross_context_target_is_the_dispatched_path_over_unfused():
    """The target takes the time of the path the engine dispatches to (the fused row's engine_path): the fused
    kernel's where it is faster, the unfused kernel's (1.0) where it is not."""
    from minikv.bench.attention import targets
    rows = _cross(64, 1, 1024, 0.75, 1.0, "fused") + _cross(8, 512, 4096, 2.0, 1.2, "unfused")
    got = {what: (round(value, 3), goal) for what, value, goal in targets(rows)}
    assert got == {
        "engine's cross context step (dispatched: fused) vs unfused, batch 64, q_len 1, encoder 1024": (1.333, 1.0),
        "engine's cross context step (dispatched: unfused) vs unfused, batch 8, q_len 512, encoder 4096": (1.0, 1.0)}


def test_cross_context_rows_from_before_the_dispatch_keep_their_line():
    """A recording without engine_path (notebooks/data/gpu_attention.csv) is judged as it was: fused vs unfused."""
    from minikv.bench.attention import targets
    ((what, value, goal),) = targets(_cross(8, 512, 4096, 2.0, 1.2))
    assert what == "fused fp8 cross context step vs unfused, batch 8, q_len 512, encoder 4096"
    assert (round(value, 3), goal) == (0.6, 1.0)


def test_cross_context_sweep_straddles_the_engines_crossover():
    """The benchmark's q_len sweep has shapes on both sides of the constant the engine dispatches by."""
    import inspect

    from minikv.attention.cross import FUSED_CROSS_MAX_QUERY_LEN
    from minikv.bench.attention import cross_context_cases
    shapes = inspect.signature(cross_context_cases).parameters["shapes"].default
    q_lens = [q for _, q, _ in shapes]
    assert min(q_lens) <= FUSED_CROSS_MAX_QUERY_LEN < max(q_lens)   # the sweep straddles the crossover

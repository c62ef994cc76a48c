"""paged_decode_attention (Triton, interpreter) against its torch reference over a sampled case matrix."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from conftest import (BLOCK_SIZES, CPU_FORMATS, HEAD_LAYOUTS, HEAD_SIZES, attention_tolerance, fill_sequences,
                      length_choices, make_pool, make_spec, random_block_tables, sample_cases)
from minikv.kernels import launch, paged_decode_attention, paged_decode_attention_reference

LENGTH_SETS = ["ones", "edges", "mixed"]


def _lengths(kind: str, block_size: int, batch: int, seed: int) -> list[int]:
    edges = length_choices(block_size)
    rng = random.Random(seed)
    if kind == "ones":
        return [1] * batch
    if kind == "edges":
        return [edges[i % len(edges)] for i in range(batch)]
    return [rng.choice(edges + [rng.randint(1, 5 * block_size)]) for _ in range(batch)]


def _run(fmt, block_size, heads, head_size, lens, k_scale=0.61, v_scale=1.7, q_transform=None, sliding_window=0,
         rel_bias=None):
    (kv_cache_dtype, dtype), (num_heads, kv_heads) = fmt, heads
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    tables, num_blocks = random_block_tables(lens, block_size)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, lens, dtype, k_scale, v_scale)
    q = torch.randn(len(lens), num_heads, head_size).to(dtype)
    if q_transform is not None:
        q = q_transform(q)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    sm_scale = head_size ** -0.5
    out = paged_decode_attention(q, pool, tables, seq_lens, spec, sm_scale, k_scale, v_scale,
                                 sliding_window=sliding_window, rel_bias=rel_bias)
    ref = paged_decode_attention_reference(q, pool, tables, seq_lens, spec, sm_scale, k_scale, v_scale,
                                           sliding_window=sliding_window, rel_bias=rel_bias)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))
    return out


CASES = sample_cases(21, 44, CPU_FORMATS, BLOCK_SIZES, HEAD_LAYOUTS, HEAD_SIZES, LENGTH_SETS)


@pytest.mark.parametrize("fmt,block_size,heads,head_size,lengths", CASES)
def test_decode_matches_reference(fmt, block_size, heads, head_size, lengths):
    lens = _lengths(lengths, block_size, batch=4, seed=block_size * 7 + head_size)
    _run(fmt, block_size, heads, head_size, lens)


@pytest.mark.parametrize("num_splits,merge_in_kernel,f16", [(2, True, False), (3, False, True), (8, True, False),
                                                           (1, False, True), (1, False, False), (3, True, True)])
@pytest.mark.parametrize("fmt", [("auto", torch.float32), ("int8_per_token_head", torch.float16),
                                 ("fp8_per_token_head", torch.float32), ("fp8", torch.float16)])
def test_split_k_merge(monkeypatch, num_splits, merge_in_kernel, f16, fmt):
    """Force the GPU's split-K path (partials merged by the last program or by a second kernel), including splits
    left empty by short sequences, and float16 dot products with q rescaled by a power of two per row."""
    original = launch.decode_config

    def forced(*args, **kwargs):
        return dataclasses.replace(original(*args, **kwargs), num_splits=num_splits, block_n=8,
                                   merge_in_kernel=merge_in_kernel, f16_dot=f16)

    monkeypatch.setattr(launch, "decode_config", forced)
    _run(fmt, 8, (8, 2), 32, [1, 7, 33, 60])


@pytest.mark.parametrize("magnitude", [3000.0, 1e-3])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_f16_dot_rescales_large_and_small_q(monkeypatch, magnitude, num_splits):
    """The float16 dot products rescale q by a power of two per row, so q far from 1 loses nothing."""
    original = launch.decode_config

    def forced(*args, **kwargs):
        return dataclasses.replace(original(*args, **kwargs), block_n=16, f16_dot=True, num_splits=num_splits,
                                   merge_in_kernel=True)

    monkeypatch.setattr(launch, "decode_config", forced)
    _run(("fp8_per_token_head", torch.float16), 16, (4, 2), 64, [9, 40],
         q_transform=lambda q: (q.float() * magnitude).half())


def test_out_argument_and_strided_q():
    fmt = ("fp8_per_token_head", torch.float32)
    spec_heads, head_size, lens = (4, 2), 32, [5, 17]
    out = _run(fmt, 16, spec_heads, head_size, lens, q_transform=lambda q: q.transpose(0, 1).contiguous()
               .transpose(0, 1))
    assert out.is_contiguous()
    spec = make_spec("auto", torch.float16, 2, 16, 8)
    tables, num_blocks = random_block_tables([3, 9], 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, [3, 9], torch.float16)
    q = torch.randn(2, 4, 16).half()
    given = torch.empty_like(q)
    result = paged_decode_attention(q, pool, tables, torch.tensor([3, 9], dtype=torch.int32), spec, 0.25,
                                    out=given)
    assert result is given
    ref = paged_decode_attention_reference(q, pool, tables, torch.tensor([3, 9], dtype=torch.int32), spec, 0.25)
    torch.testing.assert_close(given, ref, **attention_tolerance(torch.float16))


def test_unwritten_slots_beyond_seq_len_are_ignored():
    """Garbage (even NaN bytes) after a sequence's last token, in its last block, must not leak in."""
    spec = make_spec("auto", torch.float32, 1, 16, 8)
    tables, num_blocks = random_block_tables([5], 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, [5], torch.float32)
    k_view, v_view = spec.code_views(pool)
    block = int(tables[0, 0])
    k_view[block, 5:] = float("nan")
    v_view[block, 5:] = float("nan")
    q = torch.randn(1, 1, 16)
    out = paged_decode_attention(q, pool, tables, torch.tensor([5], dtype=torch.int32), spec, 0.25)
    assert torch.isfinite(out).all()


# windows shorter than, equal to and longer than the sequences [1, 7, 33, 60]
WINDOWS = [1, 5, 33, 60, 100]


@pytest.mark.parametrize("sliding_window", WINDOWS)
@pytest.mark.parametrize("fmt,heads", [(("auto", torch.float32), (8, 2)), (("int8_per_token_head", torch.float16), (4, 1)),
                                       (("fp8", torch.float16), (4, 4)), (("fp8_per_token_head", torch.float32), (8, 2))])
def test_sliding_window_matches_reference(fmt, heads, sliding_window):
    _run(fmt, 8, heads, 32, [1, 7, 33, 60], sliding_window=sliding_window)


@pytest.mark.parametrize("num_splits,merge_in_kernel,f16", [(3, True, True), (4, False, False), (1, False, True),
                                                           (8, True, False)])
@pytest.mark.parametrize("sliding_window", [5, 20, 100])
def test_sliding_window_split_k(monkeypatch, num_splits, merge_in_kernel, f16, sliding_window):
    """The window's start is not tile-aligned; splits divide only the window, so some are left empty."""
    original = launch.decode_config

    def forced(*args, **kwargs):
        return dataclasses.replace(original(*args, **kwargs), num_splits=num_splits, block_n=8,
                                   merge_in_kernel=merge_in_kernel, f16_dot=f16)

    monkeypatch.setattr(launch, "decode_config", forced)
    _run(("int8_per_token_head", torch.float16), 8, (8, 2), 32, [1, 7, 33, 60], sliding_window=sliding_window)


@pytest.mark.parametrize("merge_in_kernel", [False, True])
def test_sliding_window_never_reads_older_tokens(monkeypatch, merge_in_kernel):
    """NaN bytes in every slot before the window must not leak in: the kernel does not read them at all."""
    original = launch.decode_config
    monkeypatch.setattr(launch, "decode_config", lambda *a, **k: dataclasses.replace(
        original(*a, **k), block_n=8, merge_in_kernel=merge_in_kernel, num_splits=2))
    lens, window = [30, 19], 6
    spec = make_spec("fp8_per_token_head", torch.float32, 2, 32, 8)
    tables, num_blocks = random_block_tables(lens, 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, lens, torch.float32)
    clean = pool.clone()
    k_view, v_view = spec.code_views(pool)
    for b, length in enumerate(lens):
        for j in range(length - window):
            block, slot = int(tables[b, j // 8]), j % 8
            k_view[block, slot] = float("nan")
            v_view[block, slot] = float("nan")
    q = torch.randn(2, 4, 32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode_attention(q, pool, tables, seq_lens, spec, 0.2, sliding_window=window)
    ref = paged_decode_attention_reference(q, clean, tables, seq_lens, spec, 0.2, sliding_window=window)
    full = paged_decode_attention_reference(q, clean, tables, seq_lens, spec, 0.2)
    torch.testing.assert_close(out, ref, **attention_tolerance(torch.float32))
    assert (out - full).abs().max() > 1e-2        # the window really changes the answer


def test_sliding_window_rejects_bad_values():
    spec = make_spec("auto", torch.float32, 1, 16, 8)
    tables, num_blocks = random_block_tables([3], 8)
    pool = make_pool(spec, num_blocks)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="sliding_window"):
            paged_decode_attention(torch.randn(1, 1, 16), pool, tables, torch.tensor([3], dtype=torch.int32), spec,
                                   0.25, sliding_window=bad)


def bias_table(num_heads: int, max_distance: int) -> torch.Tensor:
    """A T5-like relative bias table [heads, max_distance + 1], large enough to change which keys win."""
    return (torch.randn(num_heads, max_distance + 1, generator=torch.Generator().manual_seed(max_distance)) * 3)


@pytest.mark.parametrize("max_distance", [0, 4, 40, 200])
@pytest.mark.parametrize("num_splits,merge_in_kernel,f16", [(1, False, False), (3, True, True), (8, False, True)])
@pytest.mark.parametrize("fmt,heads", [(("auto", torch.float32), (8, 2)), (("int8_per_token_head", torch.float16), (4, 1)),
                                       (("fp8", torch.float16), (4, 4))])
def test_relative_bias_matches_reference(monkeypatch, fmt, heads, num_splits, merge_in_kernel, f16, max_distance):
    """T5's bias by distance, clamped at max_distance; every kernel variant, split-K included."""
    original = launch.decode_config
    monkeypatch.setattr(launch, "decode_config", lambda *a, **k: dataclasses.replace(
        original(*a, **k), num_splits=num_splits, block_n=8, merge_in_kernel=merge_in_kernel, f16_dot=f16))
    _run(fmt, 8, heads, 32, [1, 7, 33, 60], rel_bias=bias_table(heads[0], max_distance))


def test_relative_bias_changes_the_answer_and_is_checked():
    spec = make_spec("auto", torch.float32, 1, 16, 8)
    tables, num_blocks = random_block_tables([20], 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, [20], torch.float32)
    args = (torch.randn(1, 2, 16), pool, tables, torch.tensor([20], dtype=torch.int32), spec, 0.25)
    biased = paged_decode_attention(*args, rel_bias=bias_table(2, 8))
    torch.testing.assert_close(biased, paged_decode_attention_reference(*args, rel_bias=bias_table(2, 8)),
                               **attention_tolerance(torch.float32))
    assert (biased - paged_decode_attention_reference(*args)).abs().max() > 1e-2
    with pytest.raises(TypeError, match="rel_bias"):
        paged_decode_attention(*args, rel_bias=torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="rel_bias"):
        paged_decode_attention(*args, rel_bias=torch.zeros(3, 4))


@pytest.mark.parametrize("fmt", CPU_FORMATS)
@pytest.mark.parametrize("heads", [(8, 1), (8, 2)])
def test_decode_head_size_512(fmt, heads):
    """gemma-4-E2B's full layers (8 query heads, 1 KV head of size 512), in every format the interpreter runs."""
    _run(fmt, 16, heads, 512, [1, 15, 17, 47], sliding_window=0)

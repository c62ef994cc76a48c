"""paged_decode_attention (Triton, interpreter) against its torch reference over a sampled case matrix."""
from __future__ import annotations

import dataclasses
import math
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


def decode_config(spec, q, lens, **changes):
    """launch.decode_config's choice for this shape, with `changes` (the GPU's options, forced in the interpreter)."""
    cfg = launch.decode_config(q.shape[0], spec.num_kv_heads, q.shape[1] // spec.num_kv_heads, spec.head_size,
                               spec.elem_bytes, max(lens), q.device, fmt=spec.fmt, placement=spec.placement)
    return dataclasses.replace(cfg, **changes)


def _run(fmt, block_size, heads, head_size, lens, k_scale=0.61, v_scale=1.7, q_transform=None, sliding_window=0,
         rel_bias=None, placement="row", **changes):
    (kv_cache_dtype, dtype), (num_heads, kv_heads) = fmt, heads
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, placement)
    tables, num_blocks = random_block_tables(lens, block_size)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, lens, dtype, k_scale, v_scale)
    q = torch.randn(len(lens), num_heads, head_size).to(dtype)
    if q_transform is not None:
        q = q_transform(q)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    sm_scale = head_size ** -0.5
    out = paged_decode_attention(q, pool, tables, seq_lens, spec, sm_scale, k_scale, v_scale,
                                 sliding_window=sliding_window, rel_bias=rel_bias,
                                 config=decode_config(spec, q, lens, **changes) if changes else None)
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


@pytest.mark.parametrize("num_splits,f16", [(2, False), (3, True), (8, False), (1, True), (1, False)])
@pytest.mark.parametrize("fmt", [("auto", torch.float32), ("int8_per_token_head", torch.float16),
                                 ("fp8_per_token_head", torch.float32), ("fp8", torch.float16)])
def test_split_k_merge(num_splits, f16, fmt):
    """Force the GPU's split-K path (partials merged by a second kernel), including splits
    left empty by short sequences, and float16 dot products with q rescaled by a power of two per row."""
    _run(fmt, 8, (8, 2), 32, [1, 7, 33, 60], num_splits=num_splits, block_n=8, f16_dot=f16)


@pytest.mark.parametrize("magnitude", [3000.0, 1e-3])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_f16_dot_rescales_large_and_small_q(magnitude, num_splits):
    """The float16 dot products rescale q by a power of two per row, so q far from 1 loses nothing."""
    _run(("fp8_per_token_head", torch.float16), 16, (4, 2), 64, [9, 40],
         q_transform=lambda q: (q.float() * magnitude).half(), block_n=16, f16_dot=True, num_splits=num_splits)


# windows shorter than, equal to and longer than the sequences [1, 7, 33, 60]
WINDOWS = [1, 5, 33, 60, 100]


@pytest.mark.parametrize("sliding_window", WINDOWS)
@pytest.mark.parametrize("fmt,heads", [(("auto", torch.float32), (8, 2)), (("int8_per_token_head", torch.float16), (4, 1)),
                                       (("fp8", torch.float16), (4, 4)), (("fp8_per_token_head", torch.float32), (8, 2))])
def test_sliding_window_matches_reference(fmt, heads, sliding_window):
    _run(fmt, 8, heads, 32, [1, 7, 33, 60], sliding_window=sliding_window)


@pytest.mark.parametrize("num_splits,f16", [(3, True), (4, False), (1, True), (8, False)])
@pytest.mark.parametrize("sliding_window", [5, 20, 100])
def test_sliding_window_split_k(num_splits, f16, sliding_window):
    """The window's start is not tile-aligned; splits divide only the window, so some are left empty."""
    _run(("int8_per_token_head", torch.float16), 8, (8, 2), 32, [1, 7, 33, 60], sliding_window=sliding_window,
         num_splits=num_splits, block_n=8, f16_dot=f16)


def test_sliding_window_never_reads_older_tokens():
    """NaN bytes in every slot before the window must not leak in: the kernel does not read them at all."""
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
    out = paged_decode_attention(q, pool, tables, seq_lens, spec, 0.2, sliding_window=window,
                                 config=decode_config(spec, q, lens, block_n=8, num_splits=2))
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
@pytest.mark.parametrize("num_splits,f16", [(1, False), (3, True), (8, True)])
@pytest.mark.parametrize("fmt,heads", [(("auto", torch.float32), (8, 2)), (("int8_per_token_head", torch.float16), (4, 1)),
                                       (("fp8", torch.float16), (4, 4))])
def test_relative_bias_matches_reference(fmt, heads, num_splits, f16, max_distance):
    """T5's bias by distance, clamped at max_distance; every kernel variant, split-K included."""
    _run(fmt, 8, heads, 32, [1, 7, 33, 60], rel_bias=bias_table(heads[0], max_distance), num_splits=num_splits,
         block_n=8, f16_dot=f16)


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


# The "row" placement's aligned reads (ROW_WINDOW, the GPU's path), with NaN-pattern bytes (0x7F is an e4m3 NaN)
# everywhere no row is written, so a stray column that reached a score would show. kv-head counts whose slot stride
# is a multiple of 16 bytes (period 1: the phases 0, 4, 8, 12 bytes occur across the heads), and slots whose rows
# go through the phases slot by slot (period 2 or 4: one program per class of token positions), gemma-4-E2B's full
# layer (one kv head of 512: 516-byte slots, period 4) among them.
ROW_WINDOW_CASES = [("int8_per_token_head", torch.float16, True, 1, (8, 4), 32),
                    ("fp8_per_token_head", torch.float32, False, 3, (8, 4), 32),
                    ("int8_per_token_head", torch.float32, False, 3, (16, 8), 64),
                    ("fp8_per_token_head", torch.float16, False, 2, (16, 8), 64),
                    ("fp8_per_token_head", torch.float16, True, 2, (4, 4), 16),
                    ("int8_per_token_head", torch.float16, False, 1, (4, 4), 16),
                    ("fp8_per_token_head", torch.float16, True, 1, (8, 1), 512),
                    ("int8_per_token_head", torch.float32, False, 8, (8, 1), 512),
                    ("fp8_per_token_head", torch.float32, False, 4, (4, 1), 32),
                    ("int8_per_token_head", torch.float16, True, 2, (4, 2), 32),
                    ("fp8_per_token_head", torch.float16, False, 6, (8, 2), 64)]


@pytest.mark.parametrize("kv_cache_dtype,dtype,f16,num_splits,heads,head_size", ROW_WINDOW_CASES)
def test_row_window_reads(kv_cache_dtype, dtype, f16, num_splits, heads, head_size):
    from minikv.kernels.decode_attention import row_window_period
    (num_heads, kv_heads), lens, block_size = heads, [1, 17, 40, 5, 66], 16
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    tables, num_blocks = random_block_tables(lens, block_size)
    pool = make_pool(spec, num_blocks)
    pool.fill_(0x7F)
    fill_sequences(pool, spec, tables, lens, dtype, 0.61, 1.7)
    assert row_window_period(pool, spec) == 16 // math.gcd(spec.slot_bytes, 16)
    q = torch.randn(len(lens), num_heads, head_size).to(dtype)
    args = (q, pool, tables, torch.tensor(lens, dtype=torch.int32), spec, head_size ** -0.5)
    cfg = decode_config(spec, q, lens, row_window=True, block_n=16, f16_dot=f16, num_splits=num_splits)
    torch.testing.assert_close(paged_decode_attention(*args, config=cfg).float(),
                               paged_decode_attention_reference(*args).float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("sliding_window", [0, 3, 21])
def test_row_window_token_classes_with_a_window(sliding_window):
    """Period 4 (one kv head of 32: 36-byte slots) with windows whose first token is in each class in turn."""
    lens = [1, 2, 3, 4, 23, 38, 40]
    spec = make_spec("fp8_per_token_head", torch.float16, 1, 32, 16)
    tables, num_blocks = random_block_tables(lens, 16)
    pool = make_pool(spec, num_blocks)
    pool.fill_(0x7F)
    fill_sequences(pool, spec, tables, lens, torch.float16, 0.61, 1.7)
    q = torch.randn(len(lens), 4, 32).to(torch.float16)
    args = (q, pool, tables, torch.tensor(lens, dtype=torch.int32), spec, 32 ** -0.5)
    for num_splits in (4, 8):
        cfg = decode_config(spec, q, lens, row_window=True, block_n=16, f16_dot=True, num_splits=num_splits)
        torch.testing.assert_close(
            paged_decode_attention(*args, config=cfg, sliding_window=sliding_window).float(),
            paged_decode_attention_reference(*args, sliding_window=sliding_window).float(),
            **attention_tolerance(torch.float16))


def test_row_window_phases_repeat_every_period():
    """The token classes' premise: a row's offset modulo 16 follows its kv head and its slot modulo the period,
    whichever block the slot is in, in both halves."""
    from minikv.kernels.addressing import row_byte_offsets
    from minikv.kernels.decode_attention import row_window_period
    for kv_heads, head_size in [(1, 512), (1, 256), (2, 32), (3, 64), (8, 128)]:
        spec = make_spec("fp8_per_token_head", torch.float16, kv_heads, head_size, 16)
        period = row_window_period(make_pool(spec, 4), spec)
        slots = torch.arange(4 * 16)
        for kv in (0, 1):
            phases = row_byte_offsets(spec, slots, kv) % 16
            assert torch.equal(phases, phases[slots % period])
            assert len({tuple(p.tolist()) for p in phases}) == period


def test_row_window_period():
    """The period in slots after which a kv head's rows start at the same 16-byte phase again (0: never read so)."""
    from minikv.kernels.decode_attention import row_window_period
    for kv_heads, placement, block_size, period in [(1, "row", 16, 4), (2, "row", 16, 2), (4, "row", 16, 1),
                                                    (4, "block", 16, 0)]:
        spec = make_spec("int8_per_token_head", torch.float16, kv_heads, 32, block_size, placement)
        assert row_window_period(make_pool(spec, 2), spec) == period

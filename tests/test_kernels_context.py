"""context_attention (unfused) and paged_context_attention (fused) against their torch references."""
from __future__ import annotations

import pytest
import torch

from conftest import (BLOCK_SIZES, CPU_FORMATS, HEAD_LAYOUTS, HEAD_SIZES, attention_tolerance, cu_seqlens,
                      fill_sequences, make_pool, make_spec, random_block_tables, sample_cases)
from minikv.kernels import (context_attention, context_attention_reference, paged_context_attention,
                            paged_context_attention_reference)

# (q lengths, kv lengths) per batch; causal needs kv >= q. "prefix" = prefill after a prefix-cache hit.
SHAPES = {
    "prefill": ([1, 9, 40], [1, 9, 40]),
    "prefix": ([3, 17, 8], [11, 33, 40]),
    "cross": ([5, 1, 20], [7, 30, 2]),
    "empty-seq": ([4, 0, 6], [4, 5, 6]),
}


def _shape(name: str, causal: bool):
    q_lens, kv_lens = SHAPES[name]
    if causal and name == "cross":
        kv_lens = [max(q, k) for q, k in zip(q_lens, kv_lens)]
    return q_lens, kv_lens


UNFUSED = sample_cases(31, 24, [torch.float16, torch.float32], [True, False], HEAD_LAYOUTS, HEAD_SIZES,
                       list(SHAPES))


@pytest.mark.parametrize("dtype,causal,heads,head_size,shape", UNFUSED)
def test_unfused_matches_reference(dtype, causal, heads, head_size, shape):
    q_lens, kv_lens = _shape(shape, causal)
    num_heads, kv_heads = heads
    q = torch.randn(sum(q_lens), num_heads, head_size).to(dtype)
    k = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype)
    v = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype)
    cq, ck = cu_seqlens(q_lens), cu_seqlens(kv_lens)
    out = context_attention(q, k, v, cq, ck, causal, head_size ** -0.5)
    ref = context_attention_reference(q, k, v, cq, ck, causal, head_size ** -0.5)
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))


PAGED = sample_cases(41, 44, CPU_FORMATS, BLOCK_SIZES, HEAD_LAYOUTS, HEAD_SIZES, [True, False], list(SHAPES))


@pytest.mark.parametrize("fmt,block_size,heads,head_size,causal,shape", PAGED)
def test_paged_matches_reference(fmt, block_size, heads, head_size, causal, shape):
    (kv_cache_dtype, dtype), (num_heads, kv_heads) = fmt, heads
    q_lens, kv_lens = _shape(shape, causal)
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    tables, num_blocks = random_block_tables(kv_lens, block_size)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, kv_lens, dtype, k_scale=0.45, v_scale=1.3)
    q = torch.randn(sum(q_lens), num_heads, head_size).to(dtype)
    args = (q, pool, tables, cu_seqlens(q_lens), torch.tensor(kv_lens, dtype=torch.int32), spec, causal,
            head_size ** -0.5, 0.45, 1.3)
    out = paged_context_attention(*args)
    ref = paged_context_attention_reference(*args)
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("causal", [True, False])
def test_several_tiles_per_sequence(causal):
    """More rows than one program's tile and more keys than one K/V tile: the loops and tile search."""
    q_lens, kv_lens = [70, 3], [300, 90]
    q = torch.randn(sum(q_lens), 4, 32)
    k, v = torch.randn(sum(kv_lens), 2, 32), torch.randn(sum(kv_lens), 2, 32)
    cq, ck = cu_seqlens(q_lens), cu_seqlens(kv_lens)
    out = context_attention(q, k, v, cq, ck, causal, 0.2)
    torch.testing.assert_close(out, context_attention_reference(q, k, v, cq, ck, causal, 0.2),
                               **attention_tolerance(torch.float32))


@pytest.mark.parametrize("causal", [True, False])
def test_fused_equals_unfused_on_a_16bit_cache(causal):
    """The two paths see the same K/V when the cache stores them as is."""
    q_lens, kv_lens = [6, 13], [6, 21] if not causal else [6, 13]
    spec = make_spec("auto", torch.float16, 2, 32, 8)
    tables, num_blocks = random_block_tables(kv_lens, 8)
    pool = make_pool(spec, num_blocks)
    k, v = fill_sequences(pool, spec, tables, kv_lens, torch.float16)
    q = torch.randn(sum(q_lens), 4, 32).half()
    cq = cu_seqlens(q_lens)
    fused = paged_context_attention(q, pool, tables, cq, torch.tensor(kv_lens, dtype=torch.int32), spec, causal, 0.3)
    unfused = context_attention(q, k, v, cq, cu_seqlens(kv_lens), causal, 0.3)
    torch.testing.assert_close(fused, unfused, atol=2e-3, rtol=2e-3)


def test_strided_q_k_v():
    qkv = torch.randn(12, (4 + 2 + 2) * 16)
    q = qkv[:, :64].view(12, 4, 16)
    k = qkv[:, 64:96].view(12, 2, 16)
    v = qkv[:, 96:].view(12, 2, 16)
    cq = cu_seqlens([5, 7])
    out = context_attention(q, k, v, cq, cq, True, 0.25)
    torch.testing.assert_close(out, context_attention_reference(q, k, v, cq, cq, True, 0.25),
                               **attention_tolerance(torch.float32))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8_per_token_head", "fp8_per_token_head"])
@pytest.mark.parametrize("causal", [True, False])
def test_paged_f16_dot_on_1byte_cache(kv_cache_dtype, causal):
    """The GPU option for 1-byte caches: float16 dot products, q rescaled by a power of two per row."""
    import dataclasses

    from minikv.kernels import launch
    q_lens, kv_lens = _shape("prefix", causal)
    spec = make_spec(kv_cache_dtype, torch.float16, 2, 32, 8)
    tables, num_blocks = random_block_tables(kv_lens, 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, kv_lens, torch.float16, k_scale=0.45, v_scale=1.3)
    q = (torch.randn(sum(q_lens), 4, 32) * torch.tensor([30.0, 1e-3, 1.0, 7.0])[None, :, None]).half()
    args = (q, pool, tables, cu_seqlens(q_lens), torch.tensor(kv_lens, dtype=torch.int32), spec, causal,
            0.02, 0.45, 1.3)
    cfg = dataclasses.replace(launch.context_config(32, q.dtype, max(q_lens) * 2, max(kv_lens)), f16_dot=True)
    torch.testing.assert_close(paged_context_attention(*args, config=cfg).float(),
                               paged_context_attention_reference(*args).float(), **attention_tolerance(torch.float16))


# windows shorter than, equal to and longer than the contexts; "prefix" has kv > q (a prefix-cache hit)
WINDOW_SHAPES = {"prefill": ([1, 9, 40, 70], [1, 9, 40, 70]), "prefix": ([3, 17, 8, 30], [11, 33, 40, 95])}


@pytest.mark.parametrize("sliding_window", [1, 4, 9, 33, 40, 200])
@pytest.mark.parametrize("shape", list(WINDOW_SHAPES))
@pytest.mark.parametrize("dtype,heads", [(torch.float32, (8, 2)), (torch.float16, (4, 1))])
def test_unfused_sliding_window(dtype, heads, shape, sliding_window):
    q_lens, kv_lens = WINDOW_SHAPES[shape]
    num_heads, kv_heads = heads
    q = torch.randn(sum(q_lens), num_heads, 32).to(dtype)
    k = torch.randn(sum(kv_lens), kv_heads, 32).to(dtype)
    v = torch.randn(sum(kv_lens), kv_heads, 32).to(dtype)
    cq, ck = cu_seqlens(q_lens), cu_seqlens(kv_lens)
    out = context_attention(q, k, v, cq, ck, True, 0.2, sliding_window=sliding_window)
    ref = context_attention_reference(q, k, v, cq, ck, True, 0.2, sliding_window=sliding_window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("sliding_window", [1, 6, 33, 40, 200])
@pytest.mark.parametrize("shape", list(WINDOW_SHAPES))
@pytest.mark.parametrize("fmt,heads", [(("auto", torch.float32), (8, 2)), (("int8_per_token_head", torch.float16), (4, 1)),
                                       (("fp8", torch.float32), (4, 4)), (("fp8_per_token_head", torch.float16), (8, 2))])
def test_paged_sliding_window(fmt, heads, shape, sliding_window):
    (kv_cache_dtype, dtype), (num_heads, kv_heads) = fmt, heads
    q_lens, kv_lens = WINDOW_SHAPES[shape]
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, 32, 8)
    tables, num_blocks = random_block_tables(kv_lens, 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, kv_lens, dtype, k_scale=0.45, v_scale=1.3)
    q = torch.randn(sum(q_lens), num_heads, 32).to(dtype)
    args = (q, pool, tables, cu_seqlens(q_lens), torch.tensor(kv_lens, dtype=torch.int32), spec, True, 0.2, 0.45, 1.3)
    out = paged_context_attention(*args, sliding_window=sliding_window)
    ref = paged_context_attention_reference(*args, sliding_window=sliding_window)
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("kv_cache_dtype,dtype", [("auto", torch.float32), ("fp8_per_token_head", torch.float16)])
@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 37)])
def test_paged_several_key_tiles(kv_cache_dtype, dtype, causal, window):
    """Key tiles of 16 tokens over blocks of 8 in a shuffled table, through each of the kernel's three loops (the
    window's masked start, the unmasked middle, the masked diagonal): the interpreter's default tile holds every key."""
    from minikv.kernels import launch
    q_lens, kv_lens = [70, 3, 120], [300, 90, 120]
    spec = make_spec(kv_cache_dtype, dtype, 2, 32, 8)
    tables, num_blocks = random_block_tables(kv_lens, 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, kv_lens, dtype, k_scale=0.45, v_scale=1.3)
    q = torch.randn(sum(q_lens), 4, 32).to(dtype)
    args = (q, pool, tables, cu_seqlens(q_lens), torch.tensor(kv_lens, dtype=torch.int32), spec, causal, 0.2, 0.45,
            1.3)
    out = paged_context_attention(*args, sliding_window=window, config=launch.ContextConfig(block_m=64, block_n=16))
    ref = paged_context_attention_reference(*args, sliding_window=window)
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (64, 16), (16, 64)])
def test_sliding_window_tiles(block_m, block_n):
    """Several query and key tiles per sequence, so the window's masked start, the unmasked middle and the masked
    diagonal all occur; a window that changes the answer."""
    from minikv.kernels import launch
    cfg = launch.ContextConfig(block_m=block_m, block_n=block_n)
    q_lens, kv_lens = [70, 3, 120], [300, 90, 120]
    q = torch.randn(sum(q_lens), 4, 32)
    k, v = torch.randn(sum(kv_lens), 2, 32), torch.randn(sum(kv_lens), 2, 32)
    cq, ck = cu_seqlens(q_lens), cu_seqlens(kv_lens)
    for window in (7, 37, 100):
        out = context_attention(q, k, v, cq, ck, True, 0.2, sliding_window=window, config=cfg)
        ref = context_attention_reference(q, k, v, cq, ck, True, 0.2, sliding_window=window)
        torch.testing.assert_close(out, ref, **attention_tolerance(torch.float32))
        full = context_attention_reference(q, k, v, cq, ck, True, 0.2)
        assert (ref - full).abs().max() > 1e-2


def test_sliding_window_needs_causal():
    q, k = torch.randn(4, 2, 16), torch.randn(4, 2, 16)
    cq = cu_seqlens([4])
    with pytest.raises(ValueError, match="causal"):
        context_attention(q, k, k, cq, cq, False, 0.25, sliding_window=3)
    with pytest.raises(ValueError, match="sliding_window"):
        context_attention(q, k, k, cq, cq, True, 0.25, sliding_window=-2)


def _bias_table(num_heads: int, max_distance: int) -> torch.Tensor:
    return torch.randn(num_heads, max_distance + 1, generator=torch.Generator().manual_seed(max_distance)) * 3


@pytest.mark.parametrize("max_distance", [0, 5, 50, 300])
@pytest.mark.parametrize("sliding_window", [0, 9])
@pytest.mark.parametrize("fmt,heads", [(("auto", torch.float32), (8, 2)), (("int8_per_token_head", torch.float16), (4, 1)),
                                       (("fp8_per_token_head", torch.float32), (4, 4))])
def test_relative_bias_paged_and_unfused(fmt, heads, sliding_window, max_distance):
    """T5's bias by distance c + i - j, clamped at max_distance, in the fused (paged) and unfused paths."""
    (kv_cache_dtype, dtype), (num_heads, kv_heads) = fmt, heads
    q_lens, kv_lens = WINDOW_SHAPES["prefix"]
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, 32, 8)
    tables, num_blocks = random_block_tables(kv_lens, 8)
    pool = make_pool(spec, num_blocks)
    k, v = fill_sequences(pool, spec, tables, kv_lens, dtype, k_scale=0.45, v_scale=1.3)
    q = torch.randn(sum(q_lens), num_heads, 32).to(dtype)
    bias = _bias_table(num_heads, max_distance)
    cq = cu_seqlens(q_lens)
    args = (q, pool, tables, cq, torch.tensor(kv_lens, dtype=torch.int32), spec, True, 0.2, 0.45, 1.3)
    kw = dict(sliding_window=sliding_window, rel_bias=bias)
    torch.testing.assert_close(paged_context_attention(*args, **kw).float(),
                               paged_context_attention_reference(*args, **kw).float(), **attention_tolerance(dtype))
    ck = cu_seqlens(kv_lens)
    out = context_attention(q, k, v, cq, ck, True, 1.0, **kw)
    ref = context_attention_reference(q, k, v, cq, ck, True, 1.0, **kw)
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))
    plain = context_attention_reference(q, k, v, cq, ck, True, 1.0, sliding_window=sliding_window)
    if max_distance:        # one column: the same bias on every key, which softmax cancels
        assert (ref.float() - plain.float()).abs().max() > 1e-2


def test_relative_bias_needs_causal():
    q, k = torch.randn(4, 2, 16), torch.randn(4, 2, 16)
    cq = cu_seqlens([4])
    with pytest.raises(ValueError, match="causal"):
        context_attention(q, k, k, cq, cq, False, 1.0, rel_bias=torch.zeros(2, 8))


@pytest.mark.parametrize("fmt", CPU_FORMATS)
@pytest.mark.parametrize("causal", [True, False])
def test_head_size_512_paged_and_unfused(fmt, causal):
    """gemma-4-E2B's full layers (8 query heads, 1 KV head of size 512): the paged kernel, and the unfused one for
    the 16/32-bit formats."""
    (kv_cache_dtype, dtype), (num_heads, kv_heads) = fmt, (8, 1)
    q_lens, kv_lens = _shape("prefix", causal)
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, 512, 16)
    tables, num_blocks = random_block_tables(kv_lens, 16)
    pool = make_pool(spec, num_blocks)
    k, v = fill_sequences(pool, spec, tables, kv_lens, dtype, k_scale=0.45, v_scale=1.3)
    q = torch.randn(sum(q_lens), num_heads, 512).to(dtype)
    args = (q, pool, tables, cu_seqlens(q_lens), torch.tensor(kv_lens, dtype=torch.int32), spec, causal,
            512 ** -0.5, 0.45, 1.3)
    torch.testing.assert_close(paged_context_attention(*args).float(),
                               paged_context_attention_reference(*args).float(), **attention_tolerance(dtype))
    if kv_cache_dtype == "auto":
        unfused = (q, k, v, cu_seqlens(q_lens), cu_seqlens(kv_lens), causal, 512 ** -0.5)
        torch.testing.assert_close(context_attention(*unfused).float(),
                                   context_attention_reference(*unfused).float(), **attention_tolerance(dtype))

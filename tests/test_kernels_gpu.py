"""The same kernel-versus-reference comparisons, compiled on a CUDA GPU, bfloat16 included. Skipped without CUDA."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import (attention_tolerance, cu_seqlens, fill_sequences, length_choices, make_pool, make_spec,
                      random_block_tables)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CUDA = "cuda"
GPU_FORMATS = [("auto", torch.bfloat16), ("auto", torch.float16), ("auto", torch.float32), ("fp8", torch.bfloat16),
               ("int8_per_token_head", torch.bfloat16), ("fp8_per_token_head", torch.float16)]


PLACEMENTS = ["row", "block"]      # where the per-token-head formats keep their scales (KVLayout.scale_placement)


def placed_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, placement):
    if placement != "row" and "per_token_head" not in kv_cache_dtype:
        pytest.skip(f"{kv_cache_dtype} has no scales to place")
    return make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, placement)


@pytest.fixture(scope="module")
def kernels():
    import minikv.kernels as k
    if k.INTERPRETED:
        pytest.skip("this process runs the Triton interpreter (TRITON_INTERPRET set)")
    return k


def test_fp8_encoder_bit_identical_to_torch_on_gpu(kernels):
    from minikv.kernels.quant import encode_e4m3, encode_e4m3_reference
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    x = every[torch.isfinite(every)].to(torch.float32)
    gen = torch.Generator().manual_seed(7)
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 20,), dtype=torch.int64, generator=gen).to(torch.int32)
    extra = bits.view(torch.float32)
    x = torch.cat([x, extra[~torch.isnan(extra)], torch.tensor([float("inf"), -float("inf"), 470.0, 464.0])])
    x = x.to(CUDA)
    got, want = encode_e4m3(x), encode_e4m3_reference(x)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} mismatches, e.g. x={x[bad[:5]].tolist()}"


@pytest.mark.parametrize("fmt", GPU_FORMATS)
@pytest.mark.parametrize("kv_heads,head_size,block_size", [(8, 128, 16), (2, 64, 8), (1, 256, 16), (2, 512, 16)])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_write_bytes_identical_on_gpu(kernels, fmt, kv_heads, head_size, block_size, placement):
    kv_cache_dtype, dtype = fmt
    spec = placed_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, placement)
    num_tokens, num_blocks = 3 * block_size + 1, 8
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[::7] = -1
    key = (torch.randn(num_tokens, kv_heads, head_size) * 3).to(dtype).to(CUDA)
    value = torch.randn(num_tokens, kv_heads, head_size).to(dtype).to(CUDA)
    pool = make_pool(spec, num_blocks, CUDA)
    expected = pool.clone()
    kernels.write_kv(key, value, pool, slots.to(CUDA), spec, 0.37, 1.9)
    kernels.write_kv_reference(key, value, expected, slots.to(CUDA), spec, 0.37, 1.9)
    assert torch.equal(pool, expected)


# Decode: every format and placement against every launch configuration the kernel can take, each case on one
# of the shapes (GQA 4:1 / 8:1 / 1:1 and 2 KV heads of 512; head sizes 128, 256 and 512: gemma-4-E2B's sliding and
# full layers), in turn. What varies at run time only (sliding windows, q magnitudes, the number of splits) is
# checked inside a case with the kernel compiled once.
DECODE_SHAPES = [(3, (32, 8), 128), (64, (8, 8), 128), (5, (8, 1), 256), (5, (8, 1), 512), (33, (8, 2), 512),
                 (5, (8, 1), 128)]
# every format in both placements where it has scales (the row placement of the 1-byte per-token-head formats
# read in aligned pieces, ROW_WINDOW: 8 KV heads of 128 make 16-byte slots; the other shapes' rows go through the
# 16-byte phases slot by slot, one program per class of token positions)
FORMAT_PLACEMENTS = [(GPU_FORMATS[0], "row"), (GPU_FORMATS[1], "row"), (GPU_FORMATS[2], "row"),
                     (GPU_FORMATS[3], "row"), (GPU_FORMATS[4], "block"), (GPU_FORMATS[5], "block"),
                     (("int8_per_token_head", torch.float32), "row")]
ROW_FORMATS = [(GPU_FORMATS[4], "row"), (GPU_FORMATS[5], "row")]
# DecodeConfig changes from launch.decode_config's own choice ("engine"), as functions of that choice and of the
# bytes per K row (the deep and large ones sized to fit shared memory; tools/gpu_compile.py --tests checks them)
DECODE_CONFIGS = {
    "engine": lambda c, row: {},
    "split-5": lambda c, row: dict(num_splits=5),
    "split-3": lambda c, row: dict(num_splits=3),
    "plain-conversion": lambda c, row: dict(convert_asm=False, num_splits=1),
    "q-dtype-dot": lambda c, row: dict(f16_dot=False, convert_asm=False),
    "small-tiles": lambda c, row: dict(block_n=16, num_warps=2, num_stages=2, num_splits=2),
    "large-tiles": lambda c, row: dict(block_n=2 * c.block_n, num_warps=8, num_stages=3 if row <= 256 else 2),
    "deep-pipeline": lambda c, row: dict(block_n=max(16, c.block_n // 2), num_stages=8 if row <= 256 else 3,
                                         k_pure=False, max_registers=128),
}
# the row placement also without its aligned reads
ROW_CONFIGS = DECODE_CONFIGS | {"row-4-byte-loads": lambda c, row: dict(row_window=False),
                                "row-4-byte-loads-split": lambda c, row: dict(row_window=False, num_splits=3)}
HEAD_128_SHAPES = [shape for shape in DECODE_SHAPES if shape[2] == 128]
DECODE_CASES = ([(fp, name, DECODE_SHAPES[i % len(DECODE_SHAPES)]) for i, (fp, name) in enumerate(
                 (fp, name) for name in DECODE_CONFIGS for fp in FORMAT_PLACEMENTS)]
                + [(fp, "engine", shape) for fp in ROW_FORMATS for shape in DECODE_SHAPES]
                + [(fp, name, HEAD_128_SHAPES[i % len(HEAD_128_SHAPES)]) for i, (fp, name) in enumerate(
                   (fp, name) for name in ROW_CONFIGS if name != "engine" for fp in ROW_FORMATS)])


@pytest.mark.parametrize("fmt_placement,config,shape", DECODE_CASES,
                         ids=[f"{f[0][0]}-{f[0][1]}-{f[1]}-{c}-b{s[0]}h{s[1][0]}x{s[1][1]}d{s[2]}".replace("torch.", "")
                              for f, c, s in DECODE_CASES])
def test_decode_on_gpu(kernels, fmt_placement, config, shape):
    """One compiled decode kernel per case, checked for sliding windows shorter and longer than the sequences, q of
    ordinary size and far beyond float16's range (bfloat16 only; sm_scale keeps the logits ordinary), and, for
    the split configurations, several split counts."""
    from minikv.kernels import launch
    ((kv_cache_dtype, dtype), placement), (batch, (num_heads, kv_heads), head_size) = fmt_placement, shape
    configs = ROW_CONFIGS if fmt_placement in ROW_FORMATS else DECODE_CONFIGS

    def forced(count):
        cfg = launch.decode_config(batch, kv_heads, num_heads // kv_heads, head_size, spec.elem_bytes,
                                   tables.shape[1] * 16, CUDA, fmt=spec.fmt, placement=spec.placement)
        change = configs[config](cfg, head_size * spec.elem_bytes)
        if count is not None:
            change["num_splits"] = count
        return dataclasses.replace(cfg, **change)

    edges = length_choices(16) + [200, 1000, 777]
    lens = [edges[i % len(edges)] for i in range(batch)]
    spec = placed_spec(kv_cache_dtype, dtype, kv_heads, head_size, 16, placement)
    tables, num_blocks = random_block_tables(lens, 16, device=CUDA)
    pool = make_pool(spec, num_blocks, CUDA)
    fill_sequences(pool, spec, tables, lens, dtype, 0.6, 1.7)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    split_counts = [None, 2, 16] if "split" in config else [None]
    for q_magnitude in ([1.0, 1e6] if dtype == torch.bfloat16 else [1.0]):
        # heads of very different sizes
        q = (torch.randn(batch, num_heads, head_size) * q_magnitude / torch.arange(1, num_heads + 1)[None, :, None])
        q = q.to(dtype).to(CUDA)
        sm = head_size ** -0.5 / q_magnitude
        for window in (0, 1, 100, 1000):
            for count in split_counts:
                cfg = forced(count)
                out = kernels.paged_decode_attention(q, pool, tables, seq_lens, spec, sm, 0.6, 1.7,
                                                     sliding_window=window, config=cfg)
                ref = kernels.paged_decode_attention_reference(q, pool, tables, seq_lens, spec, sm, 0.6, 1.7,
                                                               sliding_window=window)
                torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype),
                                           msg=lambda m: f"window {window}, |q| {q_magnitude}, {cfg}: {m}")


@pytest.mark.parametrize("dtype,causal", [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float16, True),
                                          (torch.float32, True)])
@pytest.mark.parametrize("heads,head_size", [((32, 8), 128), ((4, 4), 64), ((8, 1), 256), ((8, 1), 512)])
def test_context_unfused_on_gpu(kernels, dtype, causal, heads, head_size):
    num_heads, kv_heads = heads
    q_lens, kv_lens = [1, 130, 300, 17], ([1, 200, 300, 40] if causal else [5, 64, 1, 700])
    q = torch.randn(sum(q_lens), num_heads, head_size).to(dtype).to(CUDA)
    k = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype).to(CUDA)
    v = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype).to(CUDA)
    cq, ck = cu_seqlens(q_lens, CUDA), cu_seqlens(kv_lens, CUDA)
    out = kernels.context_attention(q, k, v, cq, ck, causal, head_size ** -0.5)
    ref = kernels.context_attention_reference(q, k, v, cq, ck, causal, head_size ** -0.5)
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("fmt,causal", [(GPU_FORMATS[0], True), (GPU_FORMATS[3], False), (GPU_FORMATS[4], True),
                                        (GPU_FORMATS[5], True)])
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("head_size,heads", [(128, (16, 4)), (256, (8, 1)), (512, (8, 1))])
def test_context_paged_on_gpu(kernels, fmt, causal, placement, head_size, heads):
    kv_cache_dtype, dtype = fmt
    block_size, (num_heads, kv_heads) = 16, heads
    q_lens, kv_lens = [1, 100, 33], ([1, 260, 33] if causal else [9, 40, 500])
    spec = placed_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, placement)
    tables, num_blocks = random_block_tables(kv_lens, block_size, device=CUDA)
    pool = make_pool(spec, num_blocks, CUDA)
    fill_sequences(pool, spec, tables, kv_lens, dtype, 0.45, 1.3)
    q = torch.randn(sum(q_lens), num_heads, head_size).to(dtype).to(CUDA)
    args = (q, pool, tables, cu_seqlens(q_lens, CUDA), torch.tensor(kv_lens, dtype=torch.int32, device=CUDA), spec,
            causal, head_size ** -0.5, 0.45, 1.3)
    out = kernels.paged_context_attention(*args)
    ref = kernels.paged_context_attention_reference(*args)
    torch.testing.assert_close(out.float(), ref.float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("q_lens,kv_lens", [([1] * 9, [700, 5, 64, 1, 33, 16, 17, 300, 2]), ([3, 12, 0], [40, 9, 7])])
def test_context_short_queries_on_gpu(kernels, q_lens, kv_lens):
    """The small query tiles chosen when sequences bring few queries (cross-attention context step), fused fp8
    and unfused bf16."""
    dtype, block_size, head_size, num_heads, kv_heads = torch.bfloat16, 16, 128, 32, 8
    spec = make_spec("fp8", dtype, kv_heads, head_size, block_size)
    tables, num_blocks = random_block_tables(kv_lens, block_size, device=CUDA)
    pool = make_pool(spec, num_blocks, CUDA)
    fill_sequences(pool, spec, tables, kv_lens, dtype, 0.45, 1.3)
    q = torch.randn(sum(q_lens), num_heads, head_size).to(dtype).to(CUDA)
    args = (q, pool, tables, cu_seqlens(q_lens, CUDA), torch.tensor(kv_lens, dtype=torch.int32, device=CUDA), spec,
            False, head_size ** -0.5, 0.45, 1.3)
    torch.testing.assert_close(kernels.paged_context_attention(*args).float(),
                               kernels.paged_context_attention_reference(*args).float(), **attention_tolerance(dtype))
    k = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype).to(CUDA)
    v = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype).to(CUDA)
    cq, ck = cu_seqlens(q_lens, CUDA), cu_seqlens(kv_lens, CUDA)
    torch.testing.assert_close(kernels.context_attention(q, k, v, cq, ck, False, head_size ** -0.5).float(),
                               kernels.context_attention_reference(q, k, v, cq, ck, False, head_size ** -0.5).float(),
                               **attention_tolerance(dtype))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8_per_token_head", "fp8_per_token_head"])
@pytest.mark.parametrize("causal,block_m", [(True, 128), (False, 16), (False, 64)])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_context_paged_f16_dot_on_gpu(kernels, kv_cache_dtype, causal, block_m, placement):
    """Paged context attention over a 1-byte cache with float16 dot products (bfloat16 q rescaled per row)."""
    from minikv.kernels import launch
    cfg = launch.ContextConfig(block_m, 64, 4, 3, True)
    dtype, block_size, head_size, num_heads, kv_heads = torch.bfloat16, 16, 128, 32, 8
    q_lens, kv_lens = ([1, 100, 33], [1, 260, 33]) if causal else ([1, 3, 40], [9, 700, 500])
    spec = placed_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, placement)
    tables, num_blocks = random_block_tables(kv_lens, block_size, device=CUDA)
    pool = make_pool(spec, num_blocks, CUDA)
    fill_sequences(pool, spec, tables, kv_lens, dtype, 0.45, 1.3)
    q = (torch.randn(sum(q_lens), num_heads, head_size) * 1e5 / torch.arange(1, 33)[None, :, None]).to(dtype)
    args = (q.to(CUDA), pool, tables, cu_seqlens(q_lens, CUDA), torch.tensor(kv_lens, dtype=torch.int32, device=CUDA),
            spec, causal, head_size ** -0.5 / 1e5, 0.45, 1.3)
    torch.testing.assert_close(kernels.paged_context_attention(*args, config=cfg).float(),
                               kernels.paged_context_attention_reference(*args).float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("fmt", [GPU_FORMATS[0], GPU_FORMATS[3], GPU_FORMATS[4], GPU_FORMATS[5]])
@pytest.mark.parametrize("sliding_window", [1, 37, 260, 4096])
def test_context_sliding_window_on_gpu(kernels, fmt, sliding_window):
    """Paged (in the cache's format) and unfused context attention with a window, GQA 4:1, prefix-cache shapes
    (the window is a launch argument: every window shares one compiled kernel per format)."""
    kv_cache_dtype, dtype = fmt
    block_size, head_size, num_heads, kv_heads = 16, 128, 16, 4
    q_lens, kv_lens = [1, 100, 33, 300], [1, 260, 33, 300]
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    tables, num_blocks = random_block_tables(kv_lens, block_size, device=CUDA)
    pool = make_pool(spec, num_blocks, CUDA)
    fill_sequences(pool, spec, tables, kv_lens, dtype, 0.45, 1.3)
    q = torch.randn(sum(q_lens), num_heads, head_size).to(dtype).to(CUDA)
    args = (q, pool, tables, cu_seqlens(q_lens, CUDA), torch.tensor(kv_lens, dtype=torch.int32, device=CUDA), spec,
            True, head_size ** -0.5, 0.45, 1.3)
    torch.testing.assert_close(kernels.paged_context_attention(*args, sliding_window=sliding_window).float(),
                               kernels.paged_context_attention_reference(*args, sliding_window=sliding_window).float(),
                               **attention_tolerance(dtype))
    if kv_cache_dtype == "auto":
        k = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype).to(CUDA)
        v = torch.randn(sum(kv_lens), kv_heads, head_size).to(dtype).to(CUDA)
        cq, ck = cu_seqlens(q_lens, CUDA), cu_seqlens(kv_lens, CUDA)
        torch.testing.assert_close(
            kernels.context_attention(q, k, v, cq, ck, True, head_size ** -0.5, sliding_window=sliding_window).float(),
            kernels.context_attention_reference(q, k, v, cq, ck, True, head_size ** -0.5,
                                                sliding_window=sliding_window).float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("fmt", [GPU_FORMATS[0], GPU_FORMATS[3], GPU_FORMATS[4]])
@pytest.mark.parametrize("max_distance", [0, 128])
@pytest.mark.parametrize("splits", [1, 5, 3])
def test_relative_bias_on_gpu(kernels, fmt, max_distance, splits):
    """T5's relative position bias in decode (split-K too) and paged and unfused context."""
    from minikv.kernels import launch
    kv_cache_dtype, dtype = fmt
    lens, num_heads, kv_heads, head_size = [1, 17, 200, 777], 12, 12, 64
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, 16)
    tables, num_blocks = random_block_tables(lens, 16, device=CUDA)
    pool = make_pool(spec, num_blocks, CUDA)
    fill_sequences(pool, spec, tables, lens, dtype, 0.6, 1.7)
    bias = (torch.randn(num_heads, max_distance + 1) * 3).to(CUDA)
    q = torch.randn(len(lens), num_heads, head_size).to(dtype).to(CUDA)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    args = (q, pool, tables, seq_lens, spec, 1.0 / 8, 0.6, 1.7)
    cfg = dataclasses.replace(launch.decode_config(len(lens), kv_heads, 1, head_size, spec.elem_bytes,
                                                   tables.shape[1] * 16, CUDA, fmt=spec.fmt, placement=spec.placement),
                              num_splits=splits)
    torch.testing.assert_close(kernels.paged_decode_attention(*args, rel_bias=bias, config=cfg).float(),
                               kernels.paged_decode_attention_reference(*args, rel_bias=bias).float(),
                               **attention_tolerance(dtype))
    q_lens = [1, 5, 100, 300]
    qc = torch.randn(sum(q_lens), num_heads, head_size).to(dtype).to(CUDA)
    cargs = (qc, pool, tables, cu_seqlens(q_lens, CUDA), seq_lens, spec, True, 1.0 / 8, 0.6, 1.7)
    torch.testing.assert_close(kernels.paged_context_attention(*cargs, rel_bias=bias).float(),
                               kernels.paged_context_attention_reference(*cargs, rel_bias=bias).float(),
                               **attention_tolerance(dtype))


@pytest.mark.parametrize("fmt", [GPU_FORMATS[0], GPU_FORMATS[3], GPU_FORMATS[4], GPU_FORMATS[5]])
def test_mixed_layouts_in_one_arena_on_gpu(kernels, fmt):
    """gemma-4-E2B's two pool layouts (256 x 1 KV head, 512 x 1 KV head) side by side in one arena."""
    from test_kernels_write import check_mixed_layouts
    check_mixed_layouts(fmt, [(1, 256), (1, 512)], 16, CUDA)

"""The 1-byte per-token-head decode for vLLM's "row" scale placement, on a GPU: v2's two kernels, kept because
they are faster on this layout than decode_attention's pipelined kernel (issue 20's measurement on an H200, batch
64 / context 4096: 349 against 412 us for int8; notebooks/data/gpu_decode_probe.csv).

A "row" row is head_size + 4 bytes (the codes, then the fp32 scale), so rows start only 4-byte aligned: copies
into shared memory would be 4 bytes wide and each row's scale a separate scattered read. These kernels read the
codes straight into registers instead, a tile ahead of their use, either byte by byte (`_row_elements_kernel`,
the scales loaded one tile ahead by hand) or as 32-bit words split into four byte planes, one dot product per
plane (`_row_words_kernel`). Which one, and the tiles, come from a sweep on the H200 (launch.ROW_DECODE_TUNED).
Both write the same partials as decode_attention's kernel and share its merge. The Triton interpreter (CPU) runs
decode_attention's kernel for every placement; these two are compiled only on a GPU and checked there against
the same reference (tests/test_kernels_gpu.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

import torch

from . import formats, launch
from .addressing import (FP8, INT8_PTH, element_strides, paged_rows, read_views, row_alignment, scale_alignment,
                         scale_word_strides, tile_scales, typed_pool)
from .decode_attention import _merge_splits_kernel, _pow2_row_scale, MERGE_CHUNK
from .decode_attention import _relative_bias as relative_bias


@triton.jit(do_not_specialize=["num_splits", "window"])
def _row_elements_kernel(q_ptr, codes_ptr, scales_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
                   stride_qb, stride_qh, stride_ob, stride_oh, stride_bt,
                   block_stride, kv_stride, slot_stride, row_stride, scale_offset, scale_slot_words,
                   scale_head_words, qk_scale, v_layer_scale,
                   num_splits, window, bias_ptr, bias_width,
                   FMT: tl.constexpr, GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                   HAS_SCALES: tl.constexpr, PREFETCH_SCALES: tl.constexpr, ROW_ALIGN: tl.constexpr,
                   SCALE_PLACEMENT: tl.constexpr, SCALE_ALIGN: tl.constexpr,
                   DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr, SCALED_F16: tl.constexpr,
                   HAS_BIAS: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    # sliding window (0 = none): only the last `window` tokens, the query's own included, are read at all
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - first, num_splits), BLOCK_N) * BLOCK_N
    start = first + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_SIZE)
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=(g < GROUP)[:, None], other=0.0)
    if SCALED_F16:
        q_pow2 = _pow2_row_scale(tl.max(tl.abs(q.to(tl.float32)), axis=1))
        q = (q.to(tl.float32) * q_pow2[:, None]).to(tl.float16)
        s_scale = qk_scale / q_pow2[:, None]
    else:
        if DOT_F32:
            q = q.to(tl.float32)
        s_scale = qk_scale
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_SIZE], tl.float32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    head_row = kv_head.to(tl.int64) * row_stride
    head_scale = scale_offset // 4 + kv_head.to(tl.int64) * scale_head_words      # "block" placement only
    block_words = block_stride // 4
    if PREFETCH_SCALES:
        # The compiler pipelines only the loads that feed tl.dot; the scales are loaded one tile ahead by hand
        # so that no iteration waits on a scattered 4-byte load.
        n0 = start + tl.arange(0, BLOCK_N)
        rows0 = paged_rows(table, n0, n0 < end, BLOCK_SIZE, block_stride, slot_stride, head_row, ROW_ALIGN)
        next_k_scale = tile_scales(scales_ptr, table, n0, rows0, n0 < end, 0, scale_offset, block_words,
                                   scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
        next_v_scale = tile_scales(scales_ptr, table, n0, rows0, n0 < end, kv_stride, scale_offset, block_words,
                                   scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
    for start_n in range(start, end, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)
        valid = n < end
        rows = paged_rows(table, n, valid, BLOCK_SIZE, block_stride, slot_stride, head_row, ROW_ALIGN)
        if HAS_SCALES:
            if PREFETCH_SCALES:
                k_scale = next_k_scale
                v_scale = next_v_scale
                n1 = n + BLOCK_N
                rows1 = paged_rows(table, n1, n1 < end, BLOCK_SIZE, block_stride, slot_stride, head_row, ROW_ALIGN)
                next_k_scale = tile_scales(scales_ptr, table, n1, rows1, n1 < end, 0, scale_offset, block_words,
                                           scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
                next_v_scale = tile_scales(scales_ptr, table, n1, rows1, n1 < end, kv_stride, scale_offset, block_words,
                                           scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
            else:
                k_scale = tile_scales(scales_ptr, table, n, rows, valid, 0, scale_offset, block_words,
                                      scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
                v_scale = tile_scales(scales_ptr, table, n, rows, valid, kv_stride, scale_offset, block_words,
                                      scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
        k = tl.load(codes_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * s_scale
        if HAS_SCALES:
            s = s * k_scale[None, :]
        if HAS_BIAS:
            s = s + relative_bias(bias_ptr, bias_width, heads, g < GROUP, seq_len - 1 - n)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(codes_ptr + kv_stride + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
        if HAS_SCALES:
            p = p * v_scale[None, :]
        acc = tl.dot(p.to(q.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m = m_new
    if FMT == FP8:
        acc = acc * v_layer_scale

    head_mask = g < GROUP
    if not SPLIT:
        out = acc / l[:, None]
        tl.store(out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
    else:
        # partials laid out [B, Hq, num_splits, D] and [B, Hq, num_splits, 2] (max, sum)
        part = (b.to(tl.int64) * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_SIZE + d[None, :], acc, mask=head_mask[:, None])
        tl.store(part_ml_ptr + part * 2, m, mask=head_mask)
        tl.store(part_ml_ptr + part * 2 + 1, l, mask=head_mask)


@triton.jit
def _byte_plane(words, J: tl.constexpr, FMT: tl.constexpr, dtype: tl.constexpr):
    """Byte J of every little-endian 32-bit word (head elements 4w + J), decoded from the format's code to dtype."""
    if FMT == INT8_PTH and dtype == tl.float16:
        # no int-to-float conversion instruction (a slow pipe): code + 128 placed in the mantissa of float16 1024
        # gives 1024 + code + 128 exactly, and one subtraction the code
        biased = ((words >> (8 * J)) & 0xFF) ^ 0x80
        return (biased | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1152.0
    elif FMT == INT8_PTH:
        return ((words << (24 - 8 * J)) >> 24).to(tl.float32).to(dtype)     # arithmetic shift sign-extends
    else:                                                                  # e4m3 codes (fp8, fp8 per token-head)
        code = ((words >> (8 * J)) & 0xFF).to(tl.uint8)
        return code.to(tl.float8e4nv, bitcast=True).to(dtype)


@triton.jit(do_not_specialize=["num_splits", "window"])
def _row_words_kernel(q_ptr, words_ptr, scales_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_acc_ptr,
                         part_ml_ptr, stride_qb, stride_qh, stride_ob, stride_oh, stride_bt,
                         block_stride, kv_stride, slot_stride, row_stride, scale_offset, scale_slot_words,
                         scale_head_words, qk_scale, v_layer_scale,
                         num_splits, window, bias_ptr, bias_width,
                         FMT: tl.constexpr, GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                         HAS_SCALES: tl.constexpr, ROW_ALIGN: tl.constexpr, SCALE_PLACEMENT: tl.constexpr,
                         SCALE_ALIGN: tl.constexpr, DOT_F32: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, SCALED_F16: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The 1-byte formats' decode: the same attention as _decode_kernel, with the codes read as 32-bit words.

    Loading 1-byte codes straight into the tensor-core operand layout makes many narrow loads, and the compiler
    does not pipeline them through the conversion: the GPU then waits on memory at every tile. Here each row is
    read as HEAD_SIZE/4 words (wide, aligned loads), one tile ahead by hand together with its scales, and split
    into four byte planes: plane J holds elements 4w + J. The dot products run per plane (q's matching columns
    against plane J of K; P against plane J of V into accumulator J), so no tile is ever re-interleaved.
    Offsets and strides are in bytes (1-byte elements); ROW_ALIGN is in words."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    # sliding window (0 = none): only the last `window` tokens, the query's own included, are read at all
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - first, num_splits), BLOCK_N) * BLOCK_N
    start = first + split * chunk
    end = tl.minimum(start + chunk, seq_len)
    W: tl.constexpr = HEAD_SIZE // 4

    g = tl.arange(0, BLOCK_G)
    w = tl.arange(0, W)
    heads = kv_head * GROUP + g
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + 4 * w[None, :]
    head_mask = (g < GROUP)[:, None]
    q0 = tl.load(q_rows + 0, mask=head_mask, other=0.0)
    q1 = tl.load(q_rows + 1, mask=head_mask, other=0.0)
    q2 = tl.load(q_rows + 2, mask=head_mask, other=0.0)
    q3 = tl.load(q_rows + 3, mask=head_mask, other=0.0)
    if SCALED_F16:
        q0, q1, q2, q3 = q0.to(tl.float32), q1.to(tl.float32), q2.to(tl.float32), q3.to(tl.float32)
        amax = tl.maximum(tl.maximum(tl.max(tl.abs(q0), axis=1), tl.max(tl.abs(q1), axis=1)),
                          tl.maximum(tl.max(tl.abs(q2), axis=1), tl.max(tl.abs(q3), axis=1)))
        q_pow2 = _pow2_row_scale(amax)[:, None]
        q0, q1 = (q0 * q_pow2).to(tl.float16), (q1 * q_pow2).to(tl.float16)
        q2, q3 = (q2 * q_pow2).to(tl.float16), (q3 * q_pow2).to(tl.float16)
        s_scale = qk_scale / q_pow2
    else:
        if DOT_F32:
            q0, q1, q2, q3 = q0.to(tl.float32), q1.to(tl.float32), q2.to(tl.float32), q3.to(tl.float32)
        s_scale = qk_scale
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc0 = tl.zeros([BLOCK_G, W], tl.float32)
    acc1 = tl.zeros([BLOCK_G, W], tl.float32)
    acc2 = tl.zeros([BLOCK_G, W], tl.float32)
    acc3 = tl.zeros([BLOCK_G, W], tl.float32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    head_row = kv_head.to(tl.int64) * row_stride
    head_scale = scale_offset // 4 + kv_head.to(tl.int64) * scale_head_words      # "block" placement only
    block_words = block_stride // 4
    v_words_ptr = words_ptr + kv_stride // 4

    n = start + tl.arange(0, BLOCK_N)
    rows = paged_rows(table, n, n < end, BLOCK_SIZE, block_stride, slot_stride, head_row, 4 * ROW_ALIGN)
    row_words = tl.multiple_of(rows // 4, ROW_ALIGN)
    next_k = tl.load(words_ptr + row_words[:, None] + w[None, :], mask=(n < end)[:, None], other=0)
    next_v = tl.load(v_words_ptr + row_words[:, None] + w[None, :], mask=(n < end)[:, None], other=0)
    if HAS_SCALES:
        next_k_scale = tile_scales(scales_ptr, table, n, rows, n < end, 0, scale_offset, block_words,
                                   scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
        next_v_scale = tile_scales(scales_ptr, table, n, rows, n < end, kv_stride, scale_offset, block_words,
                                   scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
    for start_n in range(start, end, BLOCK_N):
        valid = start_n + tl.arange(0, BLOCK_N) < end
        k_words = next_k
        v_words = next_v
        if HAS_SCALES:
            k_scale = next_k_scale
            v_scale = next_v_scale
        # the next tile's loads go out before this tile's arithmetic
        n = start_n + BLOCK_N + tl.arange(0, BLOCK_N)
        rows = paged_rows(table, n, n < end, BLOCK_SIZE, block_stride, slot_stride, head_row, 4 * ROW_ALIGN)
        row_words = tl.multiple_of(rows // 4, ROW_ALIGN)
        next_k = tl.load(words_ptr + row_words[:, None] + w[None, :], mask=(n < end)[:, None], other=0)
        next_v = tl.load(v_words_ptr + row_words[:, None] + w[None, :], mask=(n < end)[:, None], other=0)
        if HAS_SCALES:
            next_k_scale = tile_scales(scales_ptr, table, n, rows, n < end, 0, scale_offset, block_words,
                                       scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
            next_v_scale = tile_scales(scales_ptr, table, n, rows, n < end, kv_stride, scale_offset, block_words,
                                       scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)

        s = tl.dot(q0, tl.trans(_byte_plane(k_words, 0, FMT, q0.dtype)), input_precision=DOT_PRECISION)
        s = tl.dot(q1, tl.trans(_byte_plane(k_words, 1, FMT, q0.dtype)), s, input_precision=DOT_PRECISION)
        s = tl.dot(q2, tl.trans(_byte_plane(k_words, 2, FMT, q0.dtype)), s, input_precision=DOT_PRECISION)
        s = tl.dot(q3, tl.trans(_byte_plane(k_words, 3, FMT, q0.dtype)), s, input_precision=DOT_PRECISION)
        s = s * s_scale
        if HAS_SCALES:
            s = s * k_scale[None, :]
        if HAS_BIAS:
            key_pos = start_n + tl.arange(0, BLOCK_N)
            s = s + relative_bias(bias_ptr, bias_width, heads, g < GROUP, seq_len - 1 - key_pos)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if HAS_SCALES:
            p = p * v_scale[None, :]
        p = p.to(q0.dtype)
        acc0 = tl.dot(p, _byte_plane(v_words, 0, FMT, q0.dtype), acc0 * alpha[:, None], input_precision=DOT_PRECISION)
        acc1 = tl.dot(p, _byte_plane(v_words, 1, FMT, q0.dtype), acc1 * alpha[:, None], input_precision=DOT_PRECISION)
        acc2 = tl.dot(p, _byte_plane(v_words, 2, FMT, q0.dtype), acc2 * alpha[:, None], input_precision=DOT_PRECISION)
        acc3 = tl.dot(p, _byte_plane(v_words, 3, FMT, q0.dtype), acc3 * alpha[:, None], input_precision=DOT_PRECISION)
        m = m_new
    if FMT == FP8:
        acc0, acc1, acc2, acc3 = acc0 * v_layer_scale, acc1 * v_layer_scale, acc2 * v_layer_scale, acc3 * v_layer_scale

    if not SPLIT:
        out_rows = out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + 4 * w[None, :]
        ty = out_ptr.dtype.element_ty
        tl.store(out_rows + 0, (acc0 / l[:, None]).to(ty), mask=head_mask)
        tl.store(out_rows + 1, (acc1 / l[:, None]).to(ty), mask=head_mask)
        tl.store(out_rows + 2, (acc2 / l[:, None]).to(ty), mask=head_mask)
        tl.store(out_rows + 3, (acc3 / l[:, None]).to(ty), mask=head_mask)
    else:
        part = (b.to(tl.int64) * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
        part_rows = part_acc_ptr + part[:, None] * HEAD_SIZE + 4 * w[None, :]
        tl.store(part_rows + 0, acc0, mask=head_mask)
        tl.store(part_rows + 1, acc1, mask=head_mask)
        tl.store(part_rows + 2, acc2, mask=head_mask)
        tl.store(part_rows + 3, acc3, mask=head_mask)
        tl.store(part_ml_ptr + part * 2, m, mask=g < GROUP)
        tl.store(part_ml_ptr + part * 2 + 1, l, mask=g < GROUP)


def _words_apply(pool: torch.Tensor, spec) -> bool:
    """Whether the 32-bit word path can read this pool: 1-byte codes, every row on a 4-byte boundary, and at least
    64 elements per head (each byte plane's dot needs K >= 16)."""
    return (spec.elem_bytes == 1 and row_alignment(spec) % 4 == 0 and pool.data_ptr() % 4 == 0
            and spec.head_size >= 64)


def applies(spec, q: torch.Tensor) -> bool:
    """Whether a decode goes through these kernels: a 1-byte per-token-head cache in the "row" placement, compiled
    (GPU), with a 16-bit q."""
    from .mode import INTERPRETED
    return (not INTERPRETED and formats.has_inline_scales(spec.fmt) and spec.placement == formats.ROW
            and q.dtype != torch.float32)


def paged_decode_rows(q, pool, block_tables, seq_lens, spec, qk_scale: float, v_scale: float, out,
                      sliding_window: int, rel_bias) -> torch.Tensor:
    """decode_attention.paged_decode_attention for a pool `applies` accepts (inputs already validated)."""
    batch, num_heads, head_size = q.shape
    group = num_heads // spec.num_kv_heads
    max_len = block_tables.shape[1] * spec.block_size
    cfg = launch.row_decode_config(batch, spec.num_kv_heads, group, head_size, max_len, q.device, spec.fmt)
    codes, scales = read_views(pool, spec)
    split = cfg.num_splits > 1
    if split:
        part_acc = torch.empty(batch, num_heads, cfg.num_splits, head_size, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(batch, num_heads, cfg.num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out
    common = dict(FMT=spec.fmt, GROUP=group, HEAD_SIZE=head_size, BLOCK_SIZE=spec.block_size, BLOCK_G=cfg.block_g,
                  BLOCK_N=cfg.block_n, SPLIT=split, HAS_SCALES=True, DOT_F32=False,
                  SCALE_PLACEMENT=spec.placement, SCALE_ALIGN=scale_alignment(spec), SCALED_F16=cfg.f16_dot,
                  HAS_BIAS=rel_bias is not None, DOT_PRECISION="tf32", num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages)
    args = (q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
            *element_strides(spec), spec.scale_offset, *scale_word_strides(spec)[:2], qk_scale, float(v_scale),
            cfg.num_splits, int(sliding_window or 0), q if rel_bias is None else rel_bias,
            1 if rel_bias is None else rel_bias.shape[1])
    grid = (batch, spec.num_kv_heads, cfg.num_splits)
    if cfg.word_loads and _words_apply(pool, spec):
        _row_words_kernel[grid](q, typed_pool(pool, torch.int32), scales, block_tables, seq_lens, out, part_acc,
                                part_ml, *args, ROW_ALIGN=row_alignment(spec) // 4, **common)
    else:
        _row_elements_kernel[grid](q, codes, scales, block_tables, seq_lens, out, part_acc, part_ml, *args,
                                   PREFETCH_SCALES=cfg.prefetch_scales, ROW_ALIGN=row_alignment(spec), **common)
    if split:
        _merge_splits_kernel[(batch, num_heads)](part_acc, part_ml, out, out.stride(0), out.stride(1),
                                                 cfg.num_splits, HEAD_SIZE=head_size, CHUNK=MERGE_CHUNK)
    return out

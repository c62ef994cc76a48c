"""paged_decode_attention: one query token per sequence attends to the first seq_lens[b] tokens of its paged cache.

Used for self-attention decode (the sequence includes the current token, already written) and for
cross-attention decode over the encoder tokens: no causal mask either way.

One program handles one (sequence, kv head) and all query heads of that GQA group at once, so each K/V row is
read once per group. It walks the sequence in tiles of BLOCK_N tokens, looking each token's block up in the
block table, and keeps an online softmax in fp32. Quantized caches are read as codes: the K scale (per token-head
or per layer) multiplies the scores and the V scale the probabilities, so no dequantized K/V is ever built.

Split-K: one program per (sequence, kv head) is too few to keep a GPU's memory system busy (a 1-byte format moves
half the bytes per load, so it needs twice the loads in flight), so the tokens of a sequence are split over
num_splits programs that each write a partial (max, sum, unnormalized output); a second kernel merges them. The
split count, tile and warps per shape come from a sweep on the GPU (kernels/launch.py).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import formats, launch
from .addressing import (FP8, INT8_PTH, check_block_tables, check_float_tensor, check_int_tensor, check_pool,
                         check_query_against_cache, check_spec, element_strides, gather_sequence, paged_rows,
                         read_views, row_alignment, scale_alignment, scale_word_strides, tile_scales, typed_pool)
from .mode import INTERPRETED, require_device

LOG2E = math.log2(math.e)


@triton.jit
def _pow2_row_scale(amax):
    """Per row, the power of two that brings the row's largest |q| into [2^14, 2^15): q times it is exact in
    float16 for every element within 2^-24 of that largest one, so a bfloat16 q can meet 1-byte codes in a float16
    dot product (1-byte codes convert to float16 exactly, and in one instruction for e4m3)."""
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return (tl.minimum(tl.maximum(268 - e, 1), 254) << 23).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["num_splits", "window"])
def _decode_kernel(q_ptr, codes_ptr, scales_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
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
            s = s + _relative_bias(bias_ptr, bias_width, heads, g < GROUP, seq_len - 1 - n)
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
def _relative_bias(bias_ptr, bias_width, heads, head_valid, distance):
    """T5's additive bias for scores [heads, keys], in the kernels' log2 units: bias[head, min(distance,
    bias_width - 1)] from a float32 table [num_heads, bias_width]; distance = query position - key position."""
    index = tl.minimum(tl.maximum(distance, 0), bias_width - 1)
    bias = tl.load(bias_ptr + heads[:, None] * bias_width + index[None, :], mask=head_valid[:, None], other=0.0)
    return bias * 1.4426950408889634           # log2(e): scores are kept in base 2


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
def _decode_words_kernel(q_ptr, words_ptr, scales_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_acc_ptr,
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
            s = s + _relative_bias(bias_ptr, bias_width, heads, g < GROUP, seq_len - 1 - key_pos)
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


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(part_acc_ptr, part_ml_ptr, out_ptr, num_heads, stride_ob, stride_oh, num_splits,
                         HEAD_SIZE: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, HEAD_SIZE)
    part = (b.to(tl.int64) * num_heads + head) * num_splits + sp
    used = sp < num_splits
    m = tl.load(part_ml_ptr + part * 2, mask=used, other=float("-inf"))
    l = tl.load(part_ml_ptr + part * 2 + 1, mask=used, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_SIZE + d[None, :], mask=used[:, None], other=0.0)
    m_all = tl.max(m, axis=0)                      # finite: the first split always holds a token (window or not)
    w = tl.exp2(m - m_all)                         # empty splits (max -inf) weigh 0
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def _words_apply(pool: torch.Tensor, spec) -> bool:
    """Whether the 32-bit word path can read this pool: 1-byte codes, every row on a 4-byte boundary, and (on a
    GPU, where tl.dot needs K >= 16) at least 64 elements per head."""
    return (spec.elem_bytes == 1 and row_alignment(spec) % 4 == 0 and pool.data_ptr() % 4 == 0
            and (INTERPRETED or spec.head_size >= 64))


def check_rel_bias(rel_bias, q) -> None:
    if rel_bias is None:
        return
    if not isinstance(rel_bias, torch.Tensor) or rel_bias.dtype != torch.float32 or rel_bias.dim() != 2:
        raise TypeError("rel_bias must be a float32 tensor [num_heads, max_distance + 1], got "
                        f"{type(rel_bias).__name__} {getattr(rel_bias, 'dtype', '')} "
                        f"{list(getattr(rel_bias, 'shape', []))}")
    if rel_bias.shape[0] != q.shape[1] or rel_bias.shape[1] < 1 or not rel_bias.is_contiguous():
        raise ValueError(f"rel_bias must be contiguous with one row per query head ({q.shape[1]}) and at least one "
                         f"column, got shape {list(rel_bias.shape)}")
    if rel_bias.device != q.device:
        raise ValueError(f"rel_bias is on {rel_bias.device}, q on {q.device}")


def relative_bias_reference(rel_bias: torch.Tensor, q_pos: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[Hq, len(q_pos), kv_len] float32: rel_bias[h, clamp(q_pos - j, 0, max_distance)] for every key j."""
    j = torch.arange(kv_len, device=rel_bias.device)
    index = (q_pos.to(rel_bias.device)[:, None] - j[None, :]).clamp(0, rel_bias.shape[1] - 1)
    return rel_bias[:, index]


def _check_window(sliding_window) -> None:
    if sliding_window is None:
        return
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 0:
        raise ValueError(f"sliding_window must be an int >= 0 (0 or None = no window), got {sliding_window!r}")


def _validate(q, pool, block_tables, seq_lens, spec, k_scale, v_scale, out) -> None:
    check_spec(spec)
    check_float_tensor("q", q, 3)
    check_int_tensor("block_tables", block_tables, torch.int32, 2)
    check_int_tensor("seq_lens", seq_lens, torch.int32, 1)
    capacity = check_pool(pool, spec)
    require_device(q, pool, block_tables, seq_lens, out)
    batch, num_heads, head_size = q.shape
    if head_size != spec.head_size:
        raise ValueError(f"q has head size {head_size}, the cache {spec.head_size}")
    check_query_against_cache(q, spec, k_scale, v_scale)
    if block_tables.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(f"q has {batch} sequences but block_tables has {block_tables.shape[0]} rows and "
                         f"seq_lens {seq_lens.shape[0]} entries")
    if out is not None and (tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(f"out must be a {q.dtype} tensor of shape {list(q.shape)} with unit last stride, got "
                         f"{out.dtype} {list(out.shape)}")
    if batch and int(seq_lens.min()) < 1:
        raise ValueError("every seq_lens entry must be at least 1")
    check_block_tables(block_tables, seq_lens, spec, capacity)


def paged_decode_attention(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           spec, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                           out: torch.Tensor | None = None, validate: bool = True,
                           sliding_window: int = 0, rel_bias: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, Hq, D] attends to its sequence's cached K/V; returns out [B, Hq, D] in q's dtype.

    sliding_window > 0: only the last sliding_window tokens of each sequence (the query's own included) count.
    rel_bias: T5's relative position bias, float32 [Hq, max_distance + 1]; the score of key j (query position
    seq_len - 1) gets rel_bias[h, min(seq_len - 1 - j, max_distance)] added after scaling."""
    if validate:
        _validate(q, pool, block_tables, seq_lens, spec, k_scale, v_scale, out)
        _check_window(sliding_window)
        check_rel_bias(rel_bias, q)
    if q.stride(-1) != 1:
        q = q.contiguous()
    batch, num_heads, head_size = q.shape
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    group = num_heads // spec.num_kv_heads
    max_len = int(seq_lens.max()) if q.device.type == "cpu" else block_tables.shape[1] * spec.block_size
    cfg = launch.decode_config(batch, spec.num_kv_heads, group, head_size, spec.elem_bytes, max_len, q.device,
                               fmt=spec.fmt, placement=spec.placement)
    has_scales = formats.has_inline_scales(spec.fmt)
    codes, scales = read_views(pool, spec)
    qk_scale = sm_scale * LOG2E * (float(k_scale) if spec.fmt == formats.FP8 else 1.0)
    if cfg.num_splits > 1:
        part_acc = torch.empty(batch, num_heads, cfg.num_splits, head_size, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(batch, num_heads, cfg.num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out
    dot_f32 = launch.dot_in_float32(q.dtype)       # "tf32" below is ignored for 16-bit operands
    # 1-byte codes with a 16-bit q: dot products in float16 (q rescaled by a power of two per row), see
    # _pow2_row_scale; the codes convert to float16 exactly and more cheaply than to bfloat16
    scaled_f16 = cfg.f16_dot and spec.elem_bytes == 1 and q.dtype != torch.float32
    common = dict(FMT=spec.fmt, GROUP=group, HEAD_SIZE=head_size, BLOCK_SIZE=spec.block_size, BLOCK_G=cfg.block_g,
                  BLOCK_N=cfg.block_n, SPLIT=cfg.num_splits > 1, HAS_SCALES=has_scales, DOT_F32=dot_f32,
                  SCALE_PLACEMENT=spec.placement, SCALE_ALIGN=scale_alignment(spec),
                  SCALED_F16=scaled_f16, HAS_BIAS=rel_bias is not None,
                  DOT_PRECISION="ieee" if dot_f32 else "tf32", num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    args = (q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
            *element_strides(spec), spec.scale_offset, *scale_word_strides(spec)[:2], qk_scale, float(v_scale),
            cfg.num_splits, int(sliding_window or 0), q if rel_bias is None else rel_bias,
            1 if rel_bias is None else rel_bias.shape[1])
    grid = (batch, spec.num_kv_heads, cfg.num_splits)
    if cfg.word_loads and _words_apply(pool, spec):
        words = typed_pool(pool, torch.int32)
        _decode_words_kernel[grid](q, words, scales, block_tables, seq_lens, out, part_acc, part_ml, *args,
                                   ROW_ALIGN=row_alignment(spec) // 4, **common)
    else:
        _decode_kernel[grid](q, codes, scales, block_tables, seq_lens, out, part_acc, part_ml, *args,
                             PREFETCH_SCALES=has_scales and cfg.prefetch_scales, ROW_ALIGN=row_alignment(spec),
                             **common)
    if cfg.num_splits > 1:
        _merge_splits_kernel[(batch, num_heads)](
            part_acc, part_ml, out, num_heads, out.stride(0), out.stride(1), cfg.num_splits,
            HEAD_SIZE=head_size, BLOCK_S=triton.next_power_of_2(cfg.num_splits))
    return out


def paged_decode_attention_reference(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor,
                                     seq_lens: torch.Tensor, spec, sm_scale: float, k_scale: float = 1.0,
                                     v_scale: float = 1.0, out: torch.Tensor | None = None,
                                     validate: bool = True, sliding_window: int = 0,
                                     rel_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same attention in fp32 torch, one sequence at a time, K/V gathered from the pool's bytes."""
    if validate:
        _validate(q, pool, block_tables, seq_lens, spec, k_scale, v_scale, out)
        _check_window(sliding_window)
        check_rel_bias(rel_bias, q)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    group = q.shape[1] // spec.num_kv_heads
    for b, length in enumerate(seq_lens.tolist()):
        k = gather_sequence(pool, spec, block_tables[b], length, 0, k_scale).repeat_interleave(group, dim=1)
        v = gather_sequence(pool, spec, block_tables[b], length, 1, v_scale).repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].to(torch.float32), k) * sm_scale
        if rel_bias is not None:
            scores = scores + relative_bias_reference(rel_bias, torch.tensor([length - 1]), length)[:, 0]
        if sliding_window:
            scores[:, :max(0, length - sliding_window)] = float("-inf")
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v).to(out.dtype)
    return out

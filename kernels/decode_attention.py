"""paged_decode_attention: one query token per sequence attends to the first seq_lens[b] tokens of its paged cache.
See docs/internals.md#kernels-decode-attention."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import formats, launch
from .addressing import (FP8, FP8_PTH, INT8_PTH, SCALE_WORD, SCALES_IN_ROW, V_TRANSPOSED_ABOVE, element_strides,
                         gather_sequence, paged_rows, read_views, row_alignment, scale_alignment, scale_word_strides,
                         tile_scales)
from .checks import check_decode_inputs, check_rel_bias, check_window
from .mode import INTERPRETED

LOG2E = math.log2(math.e)
MERGE_CHUNK: tl.constexpr = tl.constexpr(16)    # splits merged per vector load (more loop over chunks)
TAIL: tl.constexpr = tl.constexpr(16)           # "row" window reads: bytes of a row's aligned tail piece
# _decode_kernel's DOT: the dot products in q's dtype, in float32, or in float16 with q rescaled per row.
DOT_Q: tl.constexpr = tl.constexpr(0)
DOT_F32: tl.constexpr = tl.constexpr(1)
DOT_F16: tl.constexpr = tl.constexpr(2)


@triton.jit
def pow2_row_scale(amax):
    """Per row, the power of two that brings the row's largest |q| into [2^14, 2^15)."""
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return (tl.minimum(tl.maximum(268 - e, 1), 254) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _int8_to_f16(codes, PURE: tl.constexpr):
    """int8 codes to float16, exactly, four at a time (GPU only: inline PTX)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 biased, magic;
        xor.b32 biased, $2, 0x80808080;
        prmt.b32 $0, biased, 0x64646464, 0x4140;
        prmt.b32 $1, biased, 0x64646464, 0x4342;
        mov.b32 magic, 0x64806480;
        sub.rn.f16x2 $0, $0, magic;
        sub.rn.f16x2 $1, $1, magic;
        }""",
        constraints="=r,=r,r", args=[codes], dtype=tl.float16, is_pure=PURE, pack=4)


@triton.jit
def _e4m3_to_f16(codes, PURE: tl.constexpr):
    """e4m3 codes to float16, exactly, with the hardware's packed conversion (two codes per instruction)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b16 lo, hi;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        }""",
        constraints="=r,=r,r", args=[codes], dtype=tl.float16, is_pure=PURE, pack=4)


@triton.jit
def _e4m3_to_f16_finite(codes, PURE: tl.constexpr):
    """_e4m3_to_f16, with the NaN codes (x111 1111) read as 448: for ROW_WINDOW's stray columns. min.f16x2 returns
    the other operand where one is NaN, and leaves every finite e4m3 value (|x| <= 448) as it is."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 cap;
        .reg .b16 lo, hi;
        mov.b32 cap, 0x5F005F00;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        min.f16x2 $0, $0, cap;
        min.f16x2 $1, $1, cap;
        }""",
        constraints="=r,=r,r", args=[codes], dtype=tl.float16, is_pure=PURE, pack=4)


@triton.jit
def _window_codes_to(codes, FMT: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr, PURE: tl.constexpr,
                     in_row):
    """ROW_WINDOW's K tiles as the dot's operand type, the columns outside the row (`in_row` False) finite."""
    if ASM and dtype == tl.float16 and FMT != INT8_PTH:
        return _e4m3_to_f16_finite(codes, PURE)
    elif FMT != INT8_PTH:
        return tl.where(in_row[None, :], _codes_to(codes, FMT, dtype, ASM, PURE), 0.0)
    else:
        return _codes_to(codes, FMT, dtype, ASM, PURE)


@triton.jit
def _codes_to(codes, FMT: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr, PURE: tl.constexpr):
    """A tile of codes as the dot products' operand type (scales are applied later); ASM: the PTX conversions."""
    if ASM and dtype == tl.float16 and FMT == INT8_PTH:
        return _int8_to_f16(codes, PURE)
    elif ASM and dtype == tl.float16 and FMT != INT8_PTH:
        return _e4m3_to_f16(codes, PURE)
    else:
        return codes.to(dtype)


@triton.jit
def _dot(a, b, acc, DOT: tl.constexpr):
    """tl.dot, in IEEE float32 for DOT_F32 (TF32 is never wanted; the flag is ignored for 16-bit operands)."""
    if DOT == DOT_F32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision="tf32")


@triton.jit
def _load_q(q_rows, head_mask, phase, HEAD_SIZE: tl.constexpr, ROW_WINDOW: tl.constexpr):
    """q [BLOCK_G, HEAD_SIZE] of one GQA group and ROW_WINDOW's tail [BLOCK_G, TAIL], in the window's order."""
    d = tl.arange(0, HEAD_SIZE)
    if ROW_WINDOW:
        e = tl.arange(0, TAIL)
        q = tl.load(q_rows + (d - phase)[None, :], mask=head_mask[:, None] & (d >= phase)[None, :], other=0.0)
        q_tail = tl.load(q_rows + (HEAD_SIZE - phase + e)[None, :], mask=head_mask[:, None] & (e < phase)[None, :],
                         other=0.0)
        return q, q_tail
    else:
        q = tl.load(q_rows + d[None, :], mask=head_mask[:, None], other=0.0)
        return q, q


@triton.jit
def _dot_operands(q, q_tail, qk_scale, DOT: tl.constexpr, ROW_WINDOW: tl.constexpr):
    """q and q_tail as the dot products' operands, and the factor that turns their products into base-2 logits."""
    if DOT == DOT_F16:
        amax = tl.max(tl.abs(q.to(tl.float32)), axis=1)
        if ROW_WINDOW:
            amax = tl.maximum(amax, tl.max(tl.abs(q_tail.to(tl.float32)), axis=1))
        q_pow2 = pow2_row_scale(amax)
        q = (q.to(tl.float32) * q_pow2[:, None]).to(tl.float16)
        if ROW_WINDOW:
            q_tail = (q_tail.to(tl.float32) * q_pow2[:, None]).to(tl.float16)
        return q, q_tail, qk_scale / q_pow2[:, None]
    elif DOT == DOT_F32:
        q = q.to(tl.float32)
        if ROW_WINDOW:
            q_tail = q_tail.to(tl.float32)
        return q, q_tail, qk_scale
    else:
        return q, q_tail, qk_scale


@triton.jit
def _split_range(seq_len, window, num_splits, part, TILE: tl.constexpr, PERIOD: tl.constexpr, ALIGN: tl.constexpr):
    """[start, end) of split part // PERIOD (whole tiles of the last `window` tokens; 0: all), start in its class,
    and the window's first token: splits start on a multiple of ALIGN tokens, before it if they must."""
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - first // ALIGN * ALIGN, num_splits), TILE) * TILE
    start = first // ALIGN * ALIGN + part // PERIOD * chunk
    return start + part % PERIOD, tl.minimum(start + chunk, seq_len), first


@triton.jit
def _qk(k_ptrs, k_tail, valid, q, q_tail, phase, FMT: tl.constexpr, HEAD_SIZE: tl.constexpr, DOT: tl.constexpr,
        CONVERT: tl.constexpr, ROW_WINDOW: tl.constexpr):
    """q times a tile of K codes (rows at k_ptrs [BLOCK_N, 1]; ROW_WINDOW: and their _tail), scales not applied:
    [BLOCK_G, BLOCK_N]."""
    d = tl.arange(0, HEAD_SIZE)
    if ROW_WINDOW:
        k = _window_codes_to(tl.load(k_ptrs + d[None, :], mask=valid[:, None], other=0.0), FMT, q.dtype,
                             CONVERT[0], CONVERT[1], d >= phase)
        k_tail = _window_codes_to(k_tail, FMT, q.dtype, CONVERT[0], CONVERT[1], tl.arange(0, TAIL) < phase)
        return _dot(q_tail, tl.trans(k_tail), _dot(q, tl.trans(k), None, DOT), DOT)
    else:
        k = tl.load(k_ptrs + d[None, :], mask=valid[:, None], other=0.0)
        return _dot(q, tl.trans(_codes_to(k, FMT, q.dtype, CONVERT[0], CONVERT[1])), None, DOT)


@triton.jit
def _pv(v_ptrs, v_tail, valid, p, acc, acc_tail, alpha, FMT: tl.constexpr, HEAD_SIZE: tl.constexpr,
        DOT: tl.constexpr, CONVERT: tl.constexpr, ROW_WINDOW: tl.constexpr):
    """acc (and ROW_WINDOW's acc_tail), rescaled by alpha, plus p times a tile of V codes (rows at v_ptrs; ROW_WINDOW:
    and their _tail)."""
    d = tl.arange(0, HEAD_SIZE)
    v = tl.load(v_ptrs + d[None, :], mask=valid[:, None], other=0.0)
    if ROW_WINDOW:
        acc_tail = _dot(p, _codes_to(v_tail, FMT, p.dtype, CONVERT[0], CONVERT[2]), acc_tail * alpha[:, None], DOT)
    return _dot(p, _codes_to(v, FMT, p.dtype, CONVERT[0], CONVERT[2]), acc * alpha[:, None], DOT), acc_tail


@triton.jit
def _block_tile(q, m, l, acc, start_n, first, end, s_scale, at, FMT: tl.constexpr, HEAD_SIZE: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, CONVERT: tl.constexpr,
                MASKED: tl.constexpr):
    """One tile of the "block" placement, whose V codes are stored transposed: K [BLOCK_N, D] and V [D, BLOCK_N] read
    as runs of RUN tokens of one block each, one table read a run, no masks. MASKED: the split's last tile, whose
    tokens from `end` on (any bytes, NaN codes included) read the last token's instead and count for nothing."""
    codes_ptr, table, strides, head_row, v_head, head_scale, bias, heads, seq_len = at
    block_stride, kv_stride, slot_stride = strides
    RUN: tl.constexpr = BLOCK_N if BLOCK_N < BLOCK_SIZE else BLOCK_SIZE
    d, j, t = tl.arange(0, HEAD_SIZE), tl.arange(0, RUN), start_n + tl.arange(0, BLOCK_N // RUN) * RUN   # t: runs
    token = tl.minimum(t[:, None] + j[None, :], end - 1).to(tl.uint32) if MASKED else t.to(tl.uint32)
    base = tl.load(table + token // BLOCK_SIZE).to(tl.int64) * block_stride
    slot = (token % BLOCK_SIZE).to(tl.int64)
    if not MASKED:
        base, slot = base[:, None], slot[:, None] + j[None, :]
    k = tl.load(codes_ptr + (base + slot * slot_stride + head_row)[:, :, None] + d[None, None, :])
    s = _dot(q, tl.trans(_codes_to(tl.reshape(k, [BLOCK_N, HEAD_SIZE]), FMT, q.dtype, CONVERT[0], CONVERT[1])), None,
             DOT) * s_scale
    words = codes_ptr.to(tl.pointer_type(tl.float32), bitcast=True) + base // SCALE_WORD + head_scale + slot
    n = tl.reshape(t[:, None] + j[None, :], [BLOCK_N])
    s = s * tl.reshape(tl.load(words), [BLOCK_N])[None, :]
    if bias[0] is not None:
        s = s + _relative_bias(bias[0], bias[1], heads[0], heads[1], seq_len - 1 - n)
    s = tl.where(((n >= first) & (n < end) if MASKED else n >= first)[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    p = p * tl.reshape(tl.load(words + kv_stride // SCALE_WORD), [BLOCK_N])[None, :]
    v = tl.load(codes_ptr + kv_stride + (base + v_head + slot)[:, None, :] + d[None, :, None] * BLOCK_SIZE)
    v = _codes_to(tl.reshape(tl.permute(v, (1, 0, 2)), [HEAD_SIZE, BLOCK_N]), FMT, q.dtype, CONVERT[0], True)
    return m_new, l, _dot(p.to(q.dtype), tl.trans(v), acc * alpha[:, None], DOT)


@triton.jit
def _tail(rows, valid, HEAD_SIZE: tl.constexpr, ROW_WINDOW: tl.constexpr):
    """ROW_WINDOW: the 16 bytes after a tile's row windows [BLOCK_N, TAIL] (each row's last codes, then its scale)."""
    if ROW_WINDOW:
        return tl.load(rows + HEAD_SIZE + tl.arange(0, TAIL)[None, :], mask=valid[:, None], other=0.0)
    else:
        return valid


@triton.jit
def _token_scales(tail, phase, scales_ptr, table, n, rows, valid, kv_offset, scale_offset, block_words, slot_words,
                  head_words, BLOCK_SIZE: tl.constexpr, PLACEMENT: tl.constexpr, SCALE_ALIGN: tl.constexpr,
                  ROW_WINDOW: tl.constexpr):
    """A tile's fp32 scales [BLOCK_N]. ROW_WINDOW: bytes phase..phase+3 of each row's _tail, the scale that follows
    the row's codes (row_window_period: scale_offset is the code bytes), already in registers; else tile_scales."""
    if ROW_WINDOW:
        e = tl.arange(0, TAIL)
        byte = tail.to(tl.uint8, bitcast=True).to(tl.uint32)
        shift = (((e - phase) & 3) * 8).to(tl.uint32)
        word = tl.where(((e >= phase) & (e < phase + SCALE_WORD))[None, :], byte << shift[None, :], 0)
        return tl.sum(word, axis=1).to(tl.float32, bitcast=True)
    else:
        return tile_scales(scales_ptr, table, n, rows, valid, kv_offset, scale_offset, block_words, slot_words,
                           head_words, BLOCK_SIZE, PLACEMENT, SCALE_ALIGN)


@triton.jit
def _store_rows(row_ptrs, values, tail, head_mask, phase, HEAD_SIZE: tl.constexpr, ROW_WINDOW: tl.constexpr):
    """Store a [BLOCK_G, HEAD_SIZE] tile at row_ptrs [BLOCK_G, 1], rotated back from the row window's order."""
    d = tl.arange(0, HEAD_SIZE)
    if ROW_WINDOW:
        e = tl.arange(0, TAIL)
        tl.store(row_ptrs + (d - phase)[None, :], values, mask=head_mask[:, None] & (d >= phase)[None, :])
        tl.store(row_ptrs + (HEAD_SIZE - phase + e)[None, :], tail, mask=head_mask[:, None] & (e < phase)[None, :])
    else:
        tl.store(row_ptrs + d[None, :], values, mask=head_mask[:, None])


@triton.jit
def _relative_bias(bias_ptr, bias_width, heads, head_valid, distance):
    """T5's bias [heads, keys] in log2 units: bias_ptr[head, min(distance, bias_width - 1)], float32."""
    index = tl.minimum(tl.maximum(distance, 0), bias_width - 1)
    bias = tl.load(bias_ptr + heads[:, None] * bias_width + index[None, :], mask=head_valid[:, None], other=0.0)
    return bias * 1.4426950408889634           # log2(e): scores are kept in base 2


@triton.jit(do_not_specialize=["num_splits", "window"])
def _decode_kernel(q_ptr, out_ptr, codes_ptr, block_tables_ptr, seq_lens_ptr, partials, bias_ptr,
                   strides, layout, qk_scale, v_scale, num_splits, window,
                   FMT: tl.constexpr, PLACEMENT: tl.constexpr, GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr,
                   DOT: tl.constexpr, CONVERT: tl.constexpr, ROW_WINDOW: tl.constexpr):
    """One (sequence, kv head, split, class of positions modulo PERIOD): those tokens attended by GROUP heads."""
    launch.wait_for_inputs()
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    PERIOD = ROW_WINDOW + (ROW_WINDOW == 0)     # ROW_WINDOW: the period in slots of the rows' phases, or 0 (off)
    seq_len = tl.load(seq_lens_ptr + b)
    g = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    block_stride, kv_stride, slot_stride, row_stride, scale_offset, scale_slot_words, scale_head_words = layout
    table = block_tables_ptr + b.to(tl.int64) * strides[4]
    head_row = kv_head.to(tl.int64) * row_stride
    V_COLUMNS = PLACEMENT != SCALES_IN_ROW and HEAD_SIZE > V_TRANSPOSED_ABOVE    # V stored transposed (_block_tile)
    start, end, first = _split_range(seq_len, window, num_splits, tl.program_id(2), BLOCK_N * PERIOD, PERIOD,
                                     (BLOCK_N if BLOCK_N < BLOCK_SIZE else BLOCK_SIZE) if V_COLUMNS else 1)
    # ROW_WINDOW: every row this program reads (its slot in the class) starts `phase` bytes past a 16-byte boundary
    phase = ((head_row + (start % PERIOD) * slot_stride) % 16).to(tl.int32) if ROW_WINDOW else 0
    q, q_tail = _load_q(q_ptr + b.to(tl.int64) * strides[0] + heads[:, None] * strides[1], head_mask, phase,
                        HEAD_SIZE, ROW_WINDOW)
    q, q_tail, s_scale = _dot_operands(q, q_tail, qk_scale, DOT, ROW_WINDOW)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_SIZE], tl.float32)
    acc_tail = tl.zeros([BLOCK_G, TAIL], tl.float32)                    # ROW_WINDOW only
    scales_ptr = codes_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
    head_scale = scale_offset // SCALE_WORD + kv_head.to(tl.int64) * scale_head_words      # "block" placement only
    block_words = block_stride // SCALE_WORD
    if V_COLUMNS:       # "block" placement: the split's whole tiles, then its ragged last one; no loop below
        at = (codes_ptr, table, layout[:3], head_row, kv_head.to(tl.int64) * (HEAD_SIZE * BLOCK_SIZE), head_scale,
              (bias_ptr, strides[5]), (heads, head_mask), seq_len)
        whole, end_all, end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N, end, start
        for start_n in range(start, whole, BLOCK_N):
            m, l, acc = _block_tile(q, m, l, acc, start_n, first, end_all, s_scale, at, FMT, HEAD_SIZE, BLOCK_SIZE,
                                    BLOCK_N, DOT, CONVERT, False)
        for start_n in range(whole, end_all, BLOCK_N):
            m, l, acc = _block_tile(q, m, l, acc, start_n, first, end_all, s_scale, at, FMT, HEAD_SIZE, BLOCK_SIZE,
                                    BLOCK_N, DOT, CONVERT, True)
    for start_n in range(start, end, BLOCK_N * PERIOD):
        n = start_n + PERIOD * tl.arange(0, BLOCK_N)
        valid = n < end
        rows = paged_rows(table, n, valid, BLOCK_SIZE, block_stride, slot_stride, head_row, ALIGN[0])
        code_rows = tl.multiple_of(tl.where(valid, rows - phase, 0), 16) if ROW_WINDOW else rows
        k_rows, v_rows = codes_ptr + code_rows[:, None], codes_ptr + kv_stride + code_rows[:, None]
        k_tail, v_tail = _tail(k_rows, valid, HEAD_SIZE, ROW_WINDOW), _tail(v_rows, valid, HEAD_SIZE, ROW_WINDOW)
        s = _qk(k_rows, k_tail, valid, q, q_tail, phase, FMT, HEAD_SIZE, DOT, CONVERT, ROW_WINDOW) * s_scale
        if FMT == INT8_PTH or FMT == FP8_PTH:
            s = s * _token_scales(k_tail, phase, scales_ptr, table, n, rows, valid, 0, scale_offset, block_words,
                                  scale_slot_words, head_scale, BLOCK_SIZE, PLACEMENT, ALIGN[1], ROW_WINDOW)[None, :]
        if bias_ptr is not None:
            s = s + _relative_bias(bias_ptr, strides[5], heads, head_mask, seq_len - 1 - n)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if FMT == INT8_PTH or FMT == FP8_PTH:
            p = p * _token_scales(v_tail, phase, scales_ptr, table, n, rows, valid, kv_stride, scale_offset,
                                  block_words, scale_slot_words, head_scale, BLOCK_SIZE, PLACEMENT, ALIGN[1],
                                  ROW_WINDOW)[None, :]
        acc, acc_tail = _pv(v_rows, v_tail, valid, p.to(q.dtype), acc, acc_tail, alpha, FMT, HEAD_SIZE, DOT, CONVERT,
                            ROW_WINDOW)
        m = m_new
    if FMT == FP8:
        acc = acc * v_scale
    if partials is None:
        out_type = out_ptr.dtype.element_ty
        _store_rows(out_ptr + b.to(tl.int64) * strides[2] + heads[:, None] * strides[3],
                    (acc / l[:, None]).to(out_type), (acc_tail / l[:, None]).to(out_type), head_mask, phase,
                    HEAD_SIZE, ROW_WINDOW)
    else:
        # partials laid out [B, Hq, P, D] and [B, Hq, P, 2] (max, sum), P = num_splits x PERIOD programs
        part = (b.to(tl.int64) * (tl.num_programs(1) * GROUP) + heads) * tl.num_programs(2) + tl.program_id(2)
        _store_rows(partials[0] + part[:, None] * HEAD_SIZE, acc, acc_tail, head_mask, phase, HEAD_SIZE, ROW_WINDOW)
        tl.store(partials[1] + part * 2, m, mask=head_mask)
        tl.store(partials[1] + part * 2 + 1, l, mask=head_mask)


@triton.jit
def _merge_head(part_acc_ptr, part_ml_ptr, first, num_splits, out_row_ptr, HEAD_SIZE: tl.constexpr,
                CHUNK: tl.constexpr):
    """out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over one head's splits s (M = max_s m_s)."""
    sp = tl.arange(0, CHUNK)
    d = tl.arange(0, HEAD_SIZE)
    m_all = float("-inf")
    for c in range(0, num_splits, CHUNK):
        used = c + sp < num_splits
        m_all = tl.maximum(m_all, tl.max(tl.load(part_ml_ptr + (first + c + sp) * 2, mask=used,
                                                 other=float("-inf"), cache_modifier=".cg"), axis=0))
    # m_all is finite: the first split always holds a token (window or not); empty splits (max -inf) weigh 0
    acc = tl.zeros([HEAD_SIZE], tl.float32)
    l_all = 0.0
    for c in range(0, num_splits, CHUNK):
        used = c + sp < num_splits
        part = first + c + sp
        w = tl.exp2(tl.load(part_ml_ptr + part * 2, mask=used, other=float("-inf"), cache_modifier=".cg") - m_all)
        l_all += tl.sum(w * tl.load(part_ml_ptr + part * 2 + 1, mask=used, other=0.0, cache_modifier=".cg"), axis=0)
        acc += tl.sum(w[:, None] * tl.load(part_acc_ptr + part[:, None] * HEAD_SIZE + d[None, :],
                                           mask=used[:, None], other=0.0, cache_modifier=".cg"), axis=0)
    tl.store(out_row_ptr + d, (acc / l_all).to(out_row_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(part_acc_ptr, part_ml_ptr, out_ptr, stride_ob, stride_oh, num_splits,
                         HEAD_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """Merges a split launch's partials: one program per (sequence, query head)."""
    launch.wait_for_inputs()
    b = tl.program_id(0)
    head = tl.program_id(1)
    _merge_head(part_acc_ptr, part_ml_ptr, (b.to(tl.int64) * tl.num_programs(1) + head) * num_splits, num_splits,
                out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh, HEAD_SIZE, CHUNK)


def relative_bias_reference(rel_bias: torch.Tensor, q_pos: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[Hq, len(q_pos), kv_len] float32: rel_bias[h, clamp(q_pos - j, 0, max_distance)] for every key j."""
    j = torch.arange(kv_len, device=rel_bias.device)
    index = (q_pos.to(rel_bias.device)[:, None] - j[None, :]).clamp(0, rel_bias.shape[1] - 1)
    return rel_bias[:, index]


def row_window_period(pool: torch.Tensor, spec) -> int:
    """ROW_WINDOW: the period in slots after which a kv head's rows are at the same offset past a 16-byte boundary
    again, or 0 where the "row" placement cannot be read in aligned 16-byte pieces, each scale after its codes."""
    period = 16 // math.gcd(spec.slot_bytes, 16)
    return period if (formats.has_inline_scales(spec.fmt) and spec.placement == formats.ROW and spec.elem_bytes == 1
                      and spec.scale_offset == spec.head_size >= 16 and pool.data_ptr() % 16 == 0
                      and spec.block_size % period == 0 and spec.block_bytes % 16 == 0 and spec.kv_bytes % 16 == 0
                      ) else 0


def paged_decode_attention(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           spec, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                           out: torch.Tensor | None = None, validate: bool = True, sliding_window: int = 0,
                           rel_bias: torch.Tensor | None = None, config: launch.DecodeConfig | None = None,
                           ) -> torch.Tensor:
    """q [B, Hq, D] attends to its sequence's cached K/V; returns out [B, Hq, D] in q's dtype. sliding_window > 0:
    only each sequence's last sliding_window tokens count; rel_bias: T5's float32 [Hq, max_distance + 1]."""
    if validate:
        check_decode_inputs(q, pool, block_tables, seq_lens, spec, k_scale, v_scale, out)
        check_window(sliding_window)
        check_rel_bias(rel_bias, q)
    if q.stride(-1) != 1:
        q = q.contiguous()
    batch, num_heads, head_size = q.shape
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    qk_scale = sm_scale * LOG2E * (float(k_scale) if spec.fmt == formats.FP8 else 1.0)
    group = num_heads // spec.num_kv_heads
    if config is None:
        max_len = int(seq_lens.max()) if q.device.type == "cpu" else block_tables.shape[1] * spec.block_size
        config = launch.decode_config(batch, spec.num_kv_heads, group, head_size, spec.elem_bytes, max_len,
                                      q.device, fmt=spec.fmt, placement=spec.placement)
    cfg = config
    codes, _ = read_views(pool, spec)
    # the aligned row reads (not a float32 q on a GPU: tiles too large), one program per split and token class
    period = row_window_period(pool, spec) if cfg.row_window and (INTERPRETED or q.dtype != torch.float32) else 0
    num_splits = max(1, cfg.num_splits // period) if period else cfg.num_splits
    parts = num_splits * max(period, 1)
    partials = None
    if parts > 1:
        partials = (torch.empty(batch, num_heads, parts, head_size, dtype=torch.float32, device=q.device),
                    torch.empty(batch, num_heads, parts, 2, dtype=torch.float32, device=q.device))
    # 1-byte codes with a 16-bit q: float16 dot products, q rescaled per row (pow2_row_scale)
    scaled_f16 = cfg.f16_dot and spec.elem_bytes == 1 and q.dtype != torch.float32
    dot = (DOT_F16 if scaled_f16 else DOT_F32 if launch.dot_in_float32(q.dtype) else DOT_Q).value
    _decode_kernel[(batch, spec.num_kv_heads, parts)](
        q, out, codes, block_tables, seq_lens, partials, rel_bias,
        (q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
         1 if rel_bias is None else rel_bias.shape[1]),
        (*element_strides(spec), spec.scale_offset, *scale_word_strides(spec)[:2]), qk_scale, float(v_scale),
        num_splits, int(sliding_window or 0),
        FMT=spec.fmt, PLACEMENT=spec.placement, GROUP=group, HEAD_SIZE=head_size, BLOCK_SIZE=spec.block_size,
        BLOCK_G=cfg.block_g, BLOCK_N=cfg.block_n, ALIGN=(row_alignment(spec), scale_alignment(spec)), DOT=dot,
        CONVERT=(cfg.convert_asm and scaled_f16, cfg.k_pure, cfg.v_pure),
        ROW_WINDOW=period, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch.PDL_LAUNCH,
        **({} if INTERPRETED or cfg.max_registers is None else {"maxnreg": cfg.max_registers}))
    if parts > 1:
        _merge_splits_kernel[(batch, num_heads)](*partials, out, out.stride(0), out.stride(1),
                                                 parts, HEAD_SIZE=head_size, CHUNK=MERGE_CHUNK, **launch.PDL_LAUNCH)
    return out


def paged_decode_attention_reference(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor,
                                     seq_lens: torch.Tensor, spec, sm_scale: float, k_scale: float = 1.0,
                                     v_scale: float = 1.0, out: torch.Tensor | None = None, validate: bool = True,
                                     sliding_window: int = 0, rel_bias: torch.Tensor | None = None,
                                     config=None) -> torch.Tensor:
    """The same attention in fp32 torch, one sequence at a time, K/V gathered from the pool's bytes (`config`, the
    kernel's launch configuration, is accepted and ignored)."""
    if validate:
        check_decode_inputs(q, pool, block_tables, seq_lens, spec, k_scale, v_scale, out)
        check_window(sliding_window)
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

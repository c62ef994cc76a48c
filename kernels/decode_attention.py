"""paged_decode_attention: one query token per sequence attends to the first seq_lens[b] tokens of its paged cache.

Used for self-attention decode (the sequence includes the current token, already written) and for
cross-attention decode over the encoder tokens: no causal mask either way.

One program handles one (sequence, kv head) and all query heads of that GQA group at once, so each K/V row is
read once per group. It walks the sequence in tiles of BLOCK_N tokens, looking each token's block up in the
block table, and keeps an online softmax in fp32. Quantized caches are read as codes: the K scale (per token-head
or per layer) multiplies the scores and the V scale the probabilities, so no dequantized K/V is ever built.

How the 1-byte formats reach the memory's speed:
* Each tile's K and V codes are loaded in their natural order ([tokens, head_size], 16-byte vectors where the
  rows are 16-byte aligned) straight into the two dot products, one for QK and one for PV. Loads that feed
  tl.dot are what Triton's software pipeliner stages: with num_stages > 1 they become asynchronous copies into a
  ring of shared-memory buffers, several tiles ahead, and registers hold only the current tile's arithmetic.
* The dot products run in float16 (q rescaled per row by a power of two, `pow2_row_scale`), because both 1-byte
  code types convert to float16 exactly: e4m3 with the packed hardware conversion (two codes per instruction),
  int8 with a bit trick (`_int8_to_f16`): four codes per 32-bit word, placed in the mantissas of 1024.0 and
  1024.0 subtracted, about five integer and half-precision instructions per four codes where the plain cast
  costs one slow conversion per code.

Split-K: one program per (sequence, kv head) is too few to keep a GPU's memory system busy at small batches, so
the tokens of a sequence are split over num_splits programs (launch.decode_config sizes it from the number of
SMs) that each write a partial (max, sum, unnormalized output). A second kernel merges the partials, or, with
MERGE_IN_KERNEL, the last of a sequence's programs to finish (an atomic counter per (sequence, kv head)): no
second launch, but on an H200 that was measured slower (the merge then waits in one program per sequence), so the
engine's configuration keeps the second kernel.

Both scale placements run this one kernel (SCALE_PLACEMENT says where the scales are). vLLM's "row" placement
puts each fp32 scale right after its row, so a row is head_size + 4 bytes and starts only 4-byte aligned; read as
is, its loads are 4 bytes wide. Where every block and slot stride is a multiple of 16 bytes, all rows of one kv
head sit at the same offset ("phase") past a 16-byte boundary, and ROW_WINDOW reads each row as two aligned
16-byte-vector pieces, with q loaded in the same rotated order (see the kernel).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import formats, launch
from .addressing import (FP8, SCALE_WORD, INT8_PTH, check_block_tables, check_float_tensor, check_int_tensor, check_pool,
                         check_query_against_cache, check_spec, element_strides, gather_sequence, paged_rows,
                         read_views, row_alignment, scale_alignment, scale_word_strides, tile_scales)
from .mode import INTERPRETED, require_device

LOG2E = math.log2(math.e)
MERGE_CHUNK: tl.constexpr = tl.constexpr(16)    # splits merged per vector load (more loop over chunks)
TAIL: tl.constexpr = tl.constexpr(16)           # "row" window reads: bytes of a row's aligned tail piece


@triton.jit
def pow2_row_scale(amax):
    """Per row, the power of two that brings the row's largest |q| into [2^14, 2^15): q times it is exact in
    float16 for every element within 2^-24 of that largest one, so a bfloat16 q can meet 1-byte codes in a float16
    dot product (1-byte codes convert to float16 exactly, and in one instruction for e4m3)."""
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return (tl.minimum(tl.maximum(268 - e, 1), 254) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _int8_to_f16(codes, PURE: tl.constexpr):
    """int8 codes to float16, exactly, four at a time (GPU only: inline PTX).

    Byte c ^ 0x80 is c + 128 as an unsigned byte; placed under the exponent byte 0x64 it is the float16
    1024 + c + 128 (float16 counts in steps of 1 between 1024 and 2048), and one packed subtraction of 1152
    leaves c. Per four codes: one xor, two byte permutes, two half2 subtractions."""
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
    """_e4m3_to_f16, with the NaN codes (x111 1111) read as 448 (x111 1110): for ROW_WINDOW's stray columns, which
    hold other bytes (a scale's) that q's zeros must cancel, so none may be a NaN. Valid codes convert exactly.
    Per four codes: low seven bits + 1 carries into bit 7 only for the NaN codes, whose bit 0 is then cleared."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 t, w;
        .reg .b16 lo, hi;
        and.b32 t, $2, 0x7F7F7F7F;
        add.u32 t, t, 0x01010101;
        and.b32 t, t, 0x80808080;
        shr.u32 t, t, 7;
        xor.b32 w, $2, t;
        mov.b32 {lo, hi}, w;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        }""",
        constraints="=r,=r,r", args=[codes], dtype=tl.float16, is_pure=PURE, pack=4)


@triton.jit
def _window_codes_to(codes, FMT: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr, PURE: tl.constexpr,
                     in_row):
    """ROW_WINDOW's K tiles as the dot's operand type, with the columns outside the row (`in_row` False) unable to
    poison a score: int8 codes are always finite; e4m3 ones finite through _e4m3_to_f16_finite (GPU), else zeroed."""
    if ASM and dtype == tl.float16 and FMT != INT8_PTH:
        return _e4m3_to_f16_finite(codes, PURE)
    elif FMT != INT8_PTH:
        return tl.where(in_row[None, :], _codes_to(codes, FMT, dtype, ASM, PURE), 0.0)
    else:
        return _codes_to(codes, FMT, dtype, ASM, PURE)


@triton.jit
def _codes_to(codes, FMT: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr, PURE: tl.constexpr):
    """A tile of cache elements as the dot products' operand type (codes stay codes: scales are applied later).

    ASM (GPU, 1-byte codes, float16 dots): the inline-PTX conversions above. PURE=False marks the conversion as
    one the compiler must leave where it is: used for V, whose dot product wants it transposed (tokens along
    the contraction). Left pure, the compiler moves the conversion after that transposition and reads V from
    shared memory one byte at a time; kept in place, V converts in its natural order and the float16 tile is
    transposed by the matrix-load instruction (ldmatrix.trans)."""
    if ASM and dtype == tl.float16 and FMT == INT8_PTH:
        return _int8_to_f16(codes, PURE)
    elif ASM and dtype == tl.float16 and FMT != INT8_PTH:
        return _e4m3_to_f16(codes, PURE)
    else:
        return codes.to(dtype)


@triton.jit
def _relative_bias(bias_ptr, bias_width, heads, head_valid, distance):
    """T5's additive bias for scores [heads, keys], in the kernels' log2 units: bias[head, min(distance,
    bias_width - 1)] from a float32 table [num_heads, bias_width]; distance = query position - key position."""
    index = tl.minimum(tl.maximum(distance, 0), bias_width - 1)
    bias = tl.load(bias_ptr + heads[:, None] * bias_width + index[None, :], mask=head_valid[:, None], other=0.0)
    return bias * 1.4426950408889634           # log2(e): scores are kept in base 2


@triton.jit(do_not_specialize=["num_splits", "window"])
def _decode_kernel(q_ptr, codes_ptr, scales_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
                   counters_ptr, stride_qb, stride_qh, stride_ob, stride_oh, stride_bt,
                   block_stride, kv_stride, slot_stride, row_stride, scale_offset, scale_slot_words,
                   scale_head_words, qk_scale, v_layer_scale, num_splits, window, bias_ptr, bias_width,
                   FMT: tl.constexpr, GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, MERGE_IN_KERNEL: tl.constexpr,
                   HAS_SCALES: tl.constexpr, ROW_ALIGN: tl.constexpr,
                   SCALE_PLACEMENT: tl.constexpr, SCALE_ALIGN: tl.constexpr, DOT_F32: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, SCALED_F16: tl.constexpr, CONVERT_ASM: tl.constexpr,
                   K_PURE: tl.constexpr, V_PURE: tl.constexpr, HAS_BIAS: tl.constexpr,
                   ROW_WINDOW: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_SIZE)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    head_row = kv_head.to(tl.int64) * row_stride
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    if ROW_WINDOW:
        # "row" placement, 1-byte codes: every row of this kv head starts `phase` bytes past a 16-byte boundary
        # (the launcher checked that the block and slot strides are multiples of 16). Each row is read as two
        # aligned pieces, so every load is a 16-byte vector: the main window [row - phase, row - phase + D) and
        # the tail [row - phase + D, row - phase + D + 16), which holds the row's last `phase` codes, then its
        # scale. Column c of the window is code c - phase, column e of the tail code D - phase + e; q is loaded
        # in the same rotated order (zeros where a column holds no code of this row), so the dot products need
        # no shuffle of the codes, and the accumulator is rotated back when it is stored.
        phase = (head_row % 16).to(tl.int32)
        e = tl.arange(0, TAIL)
        main_code = d >= phase
        tail_code = e < phase
        q = tl.load(q_rows + (d - phase)[None, :], mask=head_mask[:, None] & main_code[None, :], other=0.0)
        q_tail = tl.load(q_rows + (HEAD_SIZE - phase + e)[None, :], mask=head_mask[:, None] & tail_code[None, :],
                         other=0.0)
    else:
        q = tl.load(q_rows + d[None, :], mask=head_mask[:, None], other=0.0)
    # sliding window (0 = none): only the last `window` tokens, the query's own included, are read at all
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - first, num_splits), BLOCK_N) * BLOCK_N
    start = first + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    if SCALED_F16:
        amax = tl.max(tl.abs(q.to(tl.float32)), axis=1)
        if ROW_WINDOW:
            amax = tl.maximum(amax, tl.max(tl.abs(q_tail.to(tl.float32)), axis=1))
        q_pow2 = pow2_row_scale(amax)
        q = (q.to(tl.float32) * q_pow2[:, None]).to(tl.float16)
        if ROW_WINDOW:
            q_tail = (q_tail.to(tl.float32) * q_pow2[:, None]).to(tl.float16)
        s_scale = qk_scale / q_pow2[:, None]
    else:
        if DOT_F32:
            q = q.to(tl.float32)
            if ROW_WINDOW:
                q_tail = q_tail.to(tl.float32)
        s_scale = qk_scale
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_SIZE], tl.float32)
    if ROW_WINDOW:
        acc_tail = tl.zeros([BLOCK_G, TAIL], tl.float32)
    head_scale = scale_offset // SCALE_WORD + kv_head.to(tl.int64) * scale_head_words      # "block" placement only
    block_words = block_stride // SCALE_WORD
    for start_n in range(start, end, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)
        valid = n < end
        rows = paged_rows(table, n, valid, BLOCK_SIZE, block_stride, slot_stride, head_row, ROW_ALIGN)
        if ROW_WINDOW:
            window_rows = tl.multiple_of(tl.where(valid, rows - phase, 0), 16)
            # columns outside the row hold other bytes (a neighbour's scale, say), which can be e4m3 NaNs
            k = _window_codes_to(tl.load(codes_ptr + window_rows[:, None] + d[None, :], mask=valid[:, None],
                                         other=0.0), FMT, q.dtype, CONVERT_ASM, K_PURE, main_code)
            k_tail = _window_codes_to(tl.load(codes_ptr + window_rows[:, None] + HEAD_SIZE + e[None, :],
                                              mask=valid[:, None], other=0.0), FMT, q.dtype, CONVERT_ASM, K_PURE,
                                      tail_code)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = tl.dot(q_tail, tl.trans(k_tail), s, input_precision=DOT_PRECISION) * s_scale
        else:
            k = tl.load(codes_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(_codes_to(k, FMT, q.dtype, CONVERT_ASM, K_PURE)),
                       input_precision=DOT_PRECISION) * s_scale
        if HAS_SCALES:
            k_scale = tile_scales(scales_ptr, table, n, rows, valid, 0, scale_offset, block_words,
                                  scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
            s = s * k_scale[None, :]
        if HAS_BIAS:
            s = s + _relative_bias(bias_ptr, bias_width, heads, head_mask, seq_len - 1 - n)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if HAS_SCALES:
            v_scale = tile_scales(scales_ptr, table, n, rows, valid, kv_stride, scale_offset, block_words,
                                  scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
            p = p * v_scale[None, :]
        if ROW_WINDOW:
            # V's stray columns only reach the accumulator's stray columns, which are never stored
            v = tl.load(codes_ptr + kv_stride + window_rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            v_tail = tl.load(codes_ptr + kv_stride + window_rows[:, None] + HEAD_SIZE + e[None, :],
                             mask=valid[:, None], other=0.0)
            acc_tail = tl.dot(p.to(q.dtype), _codes_to(v_tail, FMT, q.dtype, CONVERT_ASM, V_PURE),
                              acc_tail * alpha[:, None], input_precision=DOT_PRECISION)
        else:
            v = tl.load(codes_ptr + kv_stride + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        acc = tl.dot(p.to(q.dtype), _codes_to(v, FMT, q.dtype, CONVERT_ASM, V_PURE), acc * alpha[:, None],
                     input_precision=DOT_PRECISION)
        m = m_new
    if FMT == FP8:
        acc = acc * v_layer_scale

    # ROW_WINDOW: window column c holds code c - phase, tail column e code HEAD_SIZE - phase + e
    if ROW_WINDOW:
        col = d - phase
        col_mask = head_mask[:, None] & main_code[None, :]
    else:
        col = d
        col_mask = head_mask[:, None]
    out_rows = out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh
    if not SPLIT:
        tl.store(out_rows + col[None, :], (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=col_mask)
        if ROW_WINDOW:
            tl.store(out_rows + (HEAD_SIZE - phase + e)[None, :], (acc_tail / l[:, None]).to(out_ptr.dtype.element_ty),
                     mask=head_mask[:, None] & tail_code[None, :])
    else:
        # partials laid out [B, Hq, num_splits, D] and [B, Hq, num_splits, 2] (max, sum)
        part = (b.to(tl.int64) * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_SIZE + col[None, :], acc, mask=col_mask)
        if ROW_WINDOW:
            tl.store(part_acc_ptr + part[:, None] * HEAD_SIZE + (HEAD_SIZE - phase + e)[None, :], acc_tail,
                     mask=head_mask[:, None] & tail_code[None, :])
        tl.store(part_ml_ptr + part * 2, m, mask=head_mask)
        tl.store(part_ml_ptr + part * 2 + 1, l, mask=head_mask)
        if MERGE_IN_KERNEL:
            # The last of this (sequence, kv head)'s programs to get here merges every partial: the barrier
            # puts all this program's stores before its increment (acq_rel: the increment publishes them, and the
            # last program's reads below see everyone's), and the last one sets the counter back to 0 for the
            # next launch (so a CUDA graph can replay it).
            tl.debug_barrier()
            counter = counters_ptr + b * tl.num_programs(1) + kv_head
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
                for h in tl.static_range(GROUP):
                    head = kv_head * GROUP + h
                    _merge_head(part_acc_ptr, part_ml_ptr,
                                (b.to(tl.int64) * (tl.num_programs(1) * GROUP) + head) * num_splits, num_splits,
                                out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh, HEAD_SIZE, MERGE_CHUNK)
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")




@triton.jit
def _merge_head(part_acc_ptr, part_ml_ptr, first, num_splits, out_row_ptr, HEAD_SIZE: tl.constexpr,
                CHUNK: tl.constexpr):
    """out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over one head's splits s (M = max_s m_s), from its
    partials at index first + s. The partials are read CHUNK splits at a time through L2 (.cg), where the other
    programs' stores are."""
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
    """The separate merge (when MERGE_IN_KERNEL is off): one program per (sequence, query head)."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    _merge_head(part_acc_ptr, part_ml_ptr, (b.to(tl.int64) * tl.num_programs(1) + head) * num_splits, num_splits,
                out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh, HEAD_SIZE, CHUNK)


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


def row_window_applies(pool: torch.Tensor, spec) -> bool:
    """Whether the "row" placement can be read in aligned 16-byte pieces (ROW_WINDOW): 1-byte codes with inline
    scales after each row, and every block, half and slot stride (and the pool's first byte) on a 16-byte
    boundary, so that all rows of one kv head share one phase against that boundary."""
    return (formats.has_inline_scales(spec.fmt) and spec.placement == formats.ROW and spec.elem_bytes == 1
            and spec.head_size >= 16 and pool.data_ptr() % 16 == 0
            and all(stride % 16 == 0 for stride in (spec.block_bytes, spec.kv_bytes, spec.slot_bytes)))


_COUNTERS: dict[str, torch.Tensor] = {}


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """n int32 zeros for the in-kernel merge's counters, one allocation per device, grown as needed.

    Every launch leaves each counter it used back at 0, so the same zeros serve the next launch (also when the
    launch is replayed from a CUDA graph). Two split launches must therefore not run at the same time on one
    device, e.g. on two streams: the engine runs its steps on one stream."""
    buf = _COUNTERS.get(str(device))
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[str(device)] = buf
    return buf


def paged_decode_attention(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           spec, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                           out: torch.Tensor | None = None, validate: bool = True,
                           sliding_window: int = 0, rel_bias: torch.Tensor | None = None,
                           config: launch.DecodeConfig | None = None) -> torch.Tensor:
    """q [B, Hq, D] attends to its sequence's cached K/V; returns out [B, Hq, D] in q's dtype.

    config: the launch configuration (None: `launch.decode_config` chooses one from the shapes and the device).

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
    qk_scale = sm_scale * LOG2E * (float(k_scale) if spec.fmt == formats.FP8 else 1.0)
    group = num_heads // spec.num_kv_heads
    if config is None:
        max_len = int(seq_lens.max()) if q.device.type == "cpu" else block_tables.shape[1] * spec.block_size
        config = launch.decode_config(batch, spec.num_kv_heads, group, head_size, spec.elem_bytes, max_len,
                                      q.device, fmt=spec.fmt, placement=spec.placement)
    cfg = config
    has_scales = formats.has_inline_scales(spec.fmt)
    codes, scales = read_views(pool, spec)
    split = cfg.num_splits > 1
    counters = out
    if split:
        part_acc = torch.empty(batch, num_heads, cfg.num_splits, head_size, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(batch, num_heads, cfg.num_splits, 2, dtype=torch.float32, device=q.device)
        if cfg.merge_in_kernel:
            counters = _split_counters(q.device, batch * spec.num_kv_heads)
    else:
        part_acc = part_ml = out
    dot_f32 = launch.dot_in_float32(q.dtype)       # "tf32" below is ignored for 16-bit operands
    # 1-byte codes with a 16-bit q: dot products in float16 (q rescaled by a power of two per row), see
    # pow2_row_scale; the codes convert to float16 exactly and more cheaply than to bfloat16
    scaled_f16 = cfg.f16_dot and spec.elem_bytes == 1 and q.dtype != torch.float32
    _decode_kernel[(batch, spec.num_kv_heads, cfg.num_splits)](
        q, codes, scales, block_tables, seq_lens, out, part_acc, part_ml, counters,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *element_strides(spec), spec.scale_offset, *scale_word_strides(spec)[:2], qk_scale, float(v_scale),
        cfg.num_splits, int(sliding_window or 0), q if rel_bias is None else rel_bias,
        1 if rel_bias is None else rel_bias.shape[1],
        FMT=spec.fmt, GROUP=group, HEAD_SIZE=head_size, BLOCK_SIZE=spec.block_size, BLOCK_G=cfg.block_g,
        BLOCK_N=cfg.block_n, SPLIT=split, MERGE_IN_KERNEL=split and cfg.merge_in_kernel,
        HAS_SCALES=has_scales, ROW_ALIGN=row_alignment(spec), SCALE_PLACEMENT=spec.placement,
        SCALE_ALIGN=scale_alignment(spec), DOT_F32=dot_f32, DOT_PRECISION="ieee" if dot_f32 else "tf32",
        SCALED_F16=scaled_f16, CONVERT_ASM=cfg.convert_asm and scaled_f16, K_PURE=cfg.k_pure,
        V_PURE=cfg.v_pure,
        HAS_BIAS=rel_bias is not None, ROW_WINDOW=cfg.row_window and row_window_applies(pool, spec)
        and (INTERPRETED or q.dtype != torch.float32),       # a float32 q on a GPU: tiles too large for it
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({} if INTERPRETED or cfg.max_registers is None else {"maxnreg": cfg.max_registers}))
    if split and not cfg.merge_in_kernel:
        _merge_splits_kernel[(batch, num_heads)](part_acc, part_ml, out, out.stride(0), out.stride(1),
                                                 cfg.num_splits, HEAD_SIZE=head_size, CHUNK=MERGE_CHUNK)
    return out


def paged_decode_attention_reference(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor,
                                     seq_lens: torch.Tensor, spec, sm_scale: float, k_scale: float = 1.0,
                                     v_scale: float = 1.0, out: torch.Tensor | None = None,
                                     validate: bool = True, sliding_window: int = 0,
                                     rel_bias: torch.Tensor | None = None,
                                     config=None) -> torch.Tensor:
    """The same attention in fp32 torch, one sequence at a time, K/V gathered from the pool's bytes (`config`, the
    kernel's launch configuration, is accepted and ignored)."""
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

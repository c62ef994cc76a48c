"""Context (prefill) attention over variable-length sequences, flash-attention style.
See docs/internals.md#kernels-context-attention."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import formats, launch
from .addressing import (FP8, SCALE_WORD, SCALES_IN_ROW, SUPPORTED_HEAD_SIZES, V_TRANSPOSED_ABOVE, check_spec,
                         element_strides, gather_sequence, paged_rows, read_views, row_alignment, scale_alignment,
                         scale_word_strides, tile_scales)
from .checks import (check_block_tables, check_float_tensor, check_int_tensor, check_pool, check_query_against_cache,
                     check_rel_bias)
from .decode_attention import pow2_row_scale, relative_bias_reference
from .mode import require_device

LOG2E = math.log2(math.e)
ONE_BYTE_FORMATS = (formats.FP8, formats.INT8_PTH, formats.FP8_PTH)


@triton.jit
def _paged_v_columns(block_table_ptr, n, live, BLOCK_SIZE: tl.constexpr, block_stride, head_offset,
                     RUN: tl.constexpr):
    """"block" placement: element offsets of tokens `n`'s first V codes (V half not added), block 0's where not
    `live`. A tile starts on a whole block and `live` masks whole blocks, so each RUN tokens are consecutive offsets:
    vector loads along tokens."""
    token = n.to(tl.uint32)
    block = tl.load(block_table_ptr + token // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
    return tl.max_contiguous(tl.multiple_of(block * block_stride + head_offset + token % BLOCK_SIZE, RUN), RUN)


@triton.jit
def _find_tile(cu_q_ptr, pid, num_seqs, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr):
    """Map a program id to (sequence, tile-within-sequence, tiles in that sequence); sequence = num_seqs if none."""
    i = tl.arange(0, BLOCK_B)
    used = i < num_seqs
    lo = tl.load(cu_q_ptr + i, mask=used, other=0)
    hi = tl.load(cu_q_ptr + i + 1, mask=used, other=0)
    tiles = tl.cdiv((hi - lo) * GROUP, BLOCK_M)
    ends = tl.cumsum(tiles, axis=0)
    seq = tl.sum((ends <= pid).to(tl.int32), axis=0)
    first = tl.sum(tl.where(i == seq, ends - tiles, 0), axis=0)
    count = tl.sum(tl.where(i == seq, tiles, 0), axis=0)
    return seq, pid - first, count


@triton.jit
def _attend(q, m, l, acc, start_n, kv_len, k_ptr, v_ptr, stride_kt, stride_vt, table, codes_ptr, scales_ptr,
            kv_stride, block_stride, slot_stride, head_row, scale_offset, scale_slot_words, head_scale, qk_scale,
            q_index, causal_offset, window, bias_ptr, bias_width, head, d, PAGED: tl.constexpr,
            MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALES: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, ROW_ALIGN: tl.constexpr,
            SCALE_PLACEMENT: tl.constexpr, SCALE_ALIGN: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K/V tile of the online softmax: returns the updated (max, sum, accumulator)."""
    n = start_n + tl.arange(0, BLOCK_N)
    valid = n < kv_len
    if PAGED:
        rows = paged_rows(table, n, valid, BLOCK_SIZE, block_stride, slot_stride, head_row, ROW_ALIGN)
        k_tile = codes_ptr + rows[:, None] + d[None, :]
        v_tile = codes_ptr + kv_stride + rows[:, None] + d[None, :]
    else:
        # 32-bit offsets inside one sequence; the 64-bit sequence start is already in the base pointers
        k_tile = k_ptr + n[:, None] * stride_kt + d[None, :]
        v_tile = v_ptr + n[:, None] * stride_vt + d[None, :]
    if MASKED:
        k = tl.load(k_tile, mask=valid[:, None], other=0.0).to(q.dtype)
    else:      # every key of the tile exists: unmasked loads vectorize best
        k = tl.load(k_tile).to(q.dtype)
    if PAGED and SCALE_PLACEMENT != SCALES_IN_ROW and d.shape[0] > V_TRANSPOSED_ABOVE:     # V stored transposed
        live = n // BLOCK_SIZE * BLOCK_SIZE < kv_len
        cols = _paged_v_columns(table, n, live, BLOCK_SIZE, block_stride, head_row * BLOCK_SIZE,
                               BLOCK_N if BLOCK_N < BLOCK_SIZE else BLOCK_SIZE)
        v = tl.load(codes_ptr + kv_stride + cols[None, :] + d[:, None] * BLOCK_SIZE)
        v = tl.trans(tl.where(valid[None, :], v.to(q.dtype), 0.0) if MASKED else v.to(q.dtype))
    elif MASKED:
        v = tl.load(v_tile, mask=valid[:, None], other=0.0).to(q.dtype)
    else:
        v = tl.load(v_tile).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if HAS_SCALES:
        k_scale = tile_scales(scales_ptr, table, n, rows, valid, 0, scale_offset, block_stride // SCALE_WORD, scale_slot_words,
                              head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
        s = s * k_scale[None, :]
    if HAS_BIAS:        # (causal only) T5's relative position bias, query position c + i
        distance = causal_offset + q_index[:, None] - n[None, :]
        index = tl.minimum(tl.maximum(distance, 0), bias_width - 1)
        s = s + tl.load(bias_ptr + head[:, None] * bias_width + index) * 1.4426950408889634    # log2(e)
    if MASKED:
        visible = valid[None, :]
        if CAUSAL:
            visible = visible & (n[None, :] <= causal_offset + q_index[:, None])
        if HAS_WINDOW:
            visible = visible & (n[None, :] > causal_offset + q_index[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    if HAS_WINDOW:
        # a row's window may start after this tile: with nothing seen yet its max is still -inf, and
        # exp2(-inf - -inf) would be NaN; a finite stand-in makes alpha and p exactly 0 instead
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if HAS_SCALES:
        v_scale = tile_scales(scales_ptr, table, n, rows, valid, kv_stride, scale_offset, block_stride // SCALE_WORD,
                              scale_slot_words, head_scale, BLOCK_SIZE, SCALE_PLACEMENT, SCALE_ALIGN)
        p = p * v_scale[None, :]
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_new, l, acc


@triton.jit
def _context_kernel(q_ptr, k_ptr, v_ptr, codes_ptr, scales_ptr, block_tables_ptr, cu_q_ptr, cu_k_ptr, seq_lens_ptr,
                    out_ptr, num_seqs, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ot, stride_oh, stride_bt, block_stride, kv_stride, slot_stride, row_stride, scale_offset,
                    scale_slot_words, scale_head_words, qk_scale, v_layer_scale, window, bias_ptr, bias_width,
                    PAGED: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_BIAS: tl.constexpr, FMT: tl.constexpr, HAS_SCALES: tl.constexpr,
                    GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, ROW_ALIGN: tl.constexpr,
                    SCALE_PLACEMENT: tl.constexpr, SCALE_ALIGN: tl.constexpr, DOT_F32: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, SCALED_F16: tl.constexpr):
    kv_head = tl.program_id(1)
    seq, tile, num_tiles = _find_tile(cu_q_ptr, tl.program_id(0), num_seqs, GROUP, BLOCK_M, BLOCK_B)
    if seq < num_seqs:
        if CAUSAL:
            tile = num_tiles - 1 - tile          # the longest tiles of a sequence start first
        q_start = tl.load(cu_q_ptr + seq)
        q_len = tl.load(cu_q_ptr + seq + 1) - q_start
        if PAGED:
            kv_len = tl.load(seq_lens_ptr + seq)
            k_base = k_ptr
            v_base = v_ptr
        else:
            k_start = tl.load(cu_k_ptr + seq)
            kv_len = tl.load(cu_k_ptr + seq + 1) - k_start
            k_base = k_ptr + k_start.to(tl.int64) * stride_kt + kv_head * stride_kh
            v_base = v_ptr + k_start.to(tl.int64) * stride_vt + kv_head * stride_vh

        r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        q_index = r // GROUP
        head = kv_head * GROUP + r % GROUP
        d = tl.arange(0, HEAD_SIZE)
        row_valid = q_index < q_len
        q_rows = (q_start + q_index).to(tl.int64)
        q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=row_valid[:, None], other=0.0)
        if SCALED_F16:      # 1-byte codes: float16 dot products, q rescaled per row (see decode's pow2_row_scale)
            q_pow2 = pow2_row_scale(tl.max(tl.abs(q.to(tl.float32)), axis=1))
            q = (q.to(tl.float32) * q_pow2[:, None]).to(tl.float16)
            s_scale = qk_scale / q_pow2[:, None]
        else:
            if DOT_F32:
                q = q.to(tl.float32)
            s_scale = qk_scale

        causal_offset = kv_len - q_len
        if CAUSAL:
            first_q = tile * BLOCK_M // GROUP
            last_q = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
            end = tl.minimum(kv_len, causal_offset + last_q + 1)
            unmasked_end = tl.minimum(kv_len, causal_offset + first_q + 1) // BLOCK_N * BLOCK_N
        else:
            end = kv_len
            unmasked_end = kv_len // BLOCK_N * BLOCK_N
        begin = 0                 # the first key tile any row sees
        unmasked_begin = 0        # from here on every row sees every key up to unmasked_end
        if HAS_WINDOW:            # (causal only) query i sees keys c + i - window < j <= c + i
            begin = tl.maximum(causal_offset + first_q - window + 1, 0) // BLOCK_N * BLOCK_N
            unmasked_begin = tl.cdiv(tl.maximum(causal_offset + last_q - window + 1, 0), BLOCK_N) * BLOCK_N
            unmasked_begin = tl.maximum(tl.minimum(unmasked_begin, unmasked_end), begin)

        table = block_tables_ptr + seq.to(tl.int64) * stride_bt
        head_row = kv_head.to(tl.int64) * row_stride
        head_scale = scale_offset // SCALE_WORD + kv_head.to(tl.int64) * scale_head_words      # "block" placement only
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_SIZE], tl.float32)
        if HAS_WINDOW:      # the window's ragged start (masked)
            for start_n in range(begin, unmasked_begin, BLOCK_N):
                m, l, acc = _attend(q, m, l, acc, start_n, kv_len, k_base, v_base, stride_kt, stride_vt, table,
                                    codes_ptr, scales_ptr, kv_stride, block_stride, slot_stride, head_row,
                                    scale_offset, scale_slot_words, head_scale, s_scale, q_index, causal_offset,
                                    window, bias_ptr, bias_width, head, d, PAGED, True, CAUSAL, HAS_WINDOW, HAS_BIAS,
                                    HAS_SCALES, BLOCK_SIZE, BLOCK_N,
                                    ROW_ALIGN, SCALE_PLACEMENT, SCALE_ALIGN, DOT_PRECISION)
        for start_n in range(unmasked_begin, unmasked_end, BLOCK_N):
            m, l, acc = _attend(q, m, l, acc, start_n, kv_len, k_base, v_base, stride_kt, stride_vt, table,
                                codes_ptr, scales_ptr, kv_stride, block_stride, slot_stride, head_row, scale_offset,
                                scale_slot_words, head_scale, s_scale, q_index, causal_offset, window, bias_ptr,
                                bias_width, head, d, PAGED, False, CAUSAL, HAS_WINDOW, HAS_BIAS, HAS_SCALES, BLOCK_SIZE, BLOCK_N, ROW_ALIGN,
                                SCALE_PLACEMENT, SCALE_ALIGN, DOT_PRECISION)
        for start_n in range(tl.maximum(unmasked_end, unmasked_begin), end, BLOCK_N):
            m, l, acc = _attend(q, m, l, acc, start_n, kv_len, k_base, v_base, stride_kt, stride_vt, table,
                                codes_ptr, scales_ptr, kv_stride, block_stride, slot_stride, head_row, scale_offset,
                                scale_slot_words, head_scale, s_scale, q_index, causal_offset, window, bias_ptr,
                                bias_width, head, d, PAGED, True, CAUSAL, HAS_WINDOW, HAS_BIAS, HAS_SCALES, BLOCK_SIZE, BLOCK_N, ROW_ALIGN,
                                SCALE_PLACEMENT, SCALE_ALIGN, DOT_PRECISION)
        if HAS_WINDOW:      # padding rows past q_len may have seen no key at all (never stored)
            l = tl.where(l > 0, l, 1.0)
        out = acc / l[:, None]
        if FMT == FP8:
            out = out * v_layer_scale
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def _launch(q, k, v, codes, scales, block_tables, cu_q, cu_k, seq_lens, spec_fields, causal, sm_scale,
            v_layer_scale, num_kv_heads, paged, window=0, rel_bias=None, config=None):
    """Shared launcher; `spec_fields` = (fmt, block_size, (block, kv, slot, row) strides, scale_offset, row
    alignment, placement, (scale slot, scale head) word strides, scale alignment)."""
    fmt, block_size, strides, scale_offset, row_align, placement, scale_strides, scale_align = spec_fields
    num_tokens, num_heads, head_size = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    batch = cu_q.shape[0] - 1
    if num_tokens == 0 or batch == 0:
        return out
    group = num_heads // num_kv_heads
    if q.device.type == "cpu":      # host values are free on CPU: size tiles and the grid exactly
        q_lens = (cu_q[1:] - cu_q[:-1]).tolist()
        kv_lens = (seq_lens if paged else cu_k[1:] - cu_k[:-1]).tolist()
        cfg = config or launch.context_config(head_size, q.dtype, max(q_lens) * group, max(kv_lens))
        programs = sum(triton.cdiv(n * group, cfg.block_m) for n in q_lens)
    else:
        cfg = config or launch.context_config(head_size, q.dtype, rows_per_seq=num_tokens * group / batch,
                                              one_byte_cache=paged and fmt in ONE_BYTE_FORMATS)
        programs = triton.cdiv(num_tokens * group, cfg.block_m) + batch    # an upper bound; extras exit at once
    if programs == 0:
        return out
    dot_f32 = launch.dot_in_float32(q.dtype)       # "tf32" below is ignored for 16-bit operands
    scaled_f16 = paged and cfg.f16_dot and fmt in ONE_BYTE_FORMATS and q.dtype != torch.float32
    _context_kernel[(programs, num_kv_heads)](
        q, k, v, codes, scales, block_tables, cu_q, cu_k, seq_lens, out, batch,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0), *strides, scale_offset, *scale_strides,
        sm_scale * LOG2E, v_layer_scale, int(window or 0), q if rel_bias is None else rel_bias,
        1 if rel_bias is None else rel_bias.shape[1],
        PAGED=paged, CAUSAL=bool(causal), HAS_WINDOW=bool(window) and bool(causal),
        HAS_BIAS=rel_bias is not None and bool(causal), FMT=fmt, HAS_SCALES=formats.has_inline_scales(fmt), GROUP=group,
        HEAD_SIZE=head_size, BLOCK_SIZE=block_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ROW_ALIGN=row_align,
        SCALE_PLACEMENT=placement, SCALE_ALIGN=scale_align,
        BLOCK_B=max(16, triton.next_power_of_2(batch)), DOT_F32=dot_f32, DOT_PRECISION="ieee" if dot_f32 else "tf32",
        SCALED_F16=scaled_f16, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int) -> torch.Tensor:
    host = cu.cpu()
    if host.numel() < 1 or int(host[0]) != 0 or int(host[-1]) != total or bool((host[1:] < host[:-1]).any()):
        raise ValueError(f"{name} must start at 0, never decrease and end at the token count {total}, "
                         f"got {host.tolist()}")
    return (host[1:] - host[:-1]).to(torch.int64)


def _check_lengths(q_lens: torch.Tensor, kv_lens: torch.Tensor, causal: bool) -> None:
    if causal and bool((kv_lens < q_lens).any()):
        raise ValueError("causal attention needs at least as many keys as queries in every sequence "
                         f"(q lengths {q_lens.tolist()}, kv lengths {kv_lens.tolist()})")
    if bool(((q_lens > 0) & (kv_lens < 1)).any()):
        raise ValueError(f"a sequence with queries has no keys (kv lengths {kv_lens.tolist()})")


def _validate_unfused(q, k, v, cu_seqlens_q, cu_seqlens_k, causal) -> None:
    check_float_tensor("q", q, 3)
    check_float_tensor("k", k, 3)
    check_float_tensor("v", v, 3)
    check_int_tensor("cu_seqlens_q", cu_seqlens_q, torch.int32, 1)
    check_int_tensor("cu_seqlens_k", cu_seqlens_k, torch.int32, 1)
    require_device(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {list(k.shape)} and {list(v.shape)}")
    head_size = q.shape[2]
    if head_size not in SUPPORTED_HEAD_SIZES or k.shape[2] != head_size:
        raise ValueError(f"unsupported head sizes q {head_size} / k {k.shape[2]}; both must be one of "
                         f"{SUPPORTED_HEAD_SIZES}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads, not a multiple of k's {k.shape[1]} kv heads")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
    q_lens = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    kv_lens = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    _check_lengths(q_lens, kv_lens, causal)


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, causal: bool, sm_scale: float, validate: bool = True,
                      sliding_window: int = 0, rel_bias: torch.Tensor | None = None,
                      config: launch.ContextConfig | None = None) -> torch.Tensor:
    """Attention of q [Tq, Hq, D] over workspace k/v [Tk, Hkv, D]; sequences delimited by cu_seqlens (int32
    [B+1])."""
    if validate:
        _validate_unfused(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
        _check_window(sliding_window, causal, rel_bias, q)
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    spec_fields = (formats.F16, 16, (0, 0, 0, 0), 0, 1, formats.ROW, (0, 0), 1)       # no cache involved
    return _launch(q, k, v, q, q, cu_seqlens_q, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q, spec_fields, causal,
                   sm_scale, 1.0, k.shape[1], paged=False, window=sliding_window, rel_bias=rel_bias, config=config)


def context_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                cu_seqlens_k: torch.Tensor, causal: bool, sm_scale: float,
                                validate: bool = True, sliding_window: int = 0,
                                rel_bias: torch.Tensor | None = None, config=None) -> torch.Tensor:
    """context_attention in fp32 torch, one sequence at a time (`config` is accepted and ignored)."""
    if validate:
        _validate_unfused(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
        _check_window(sliding_window, causal, rel_bias, q)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        _attend_reference(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]].float(), v[ck[b]:ck[b + 1]].float(), causal,
                          sm_scale, out[cq[b]:cq[b + 1]], sliding_window, rel_bias)
    return out


def _check_window(sliding_window, causal, rel_bias=None, q=None) -> None:
    """The sliding window's and the relative bias's checks (both apply to causal attention only)."""
    check_rel_bias(rel_bias, q)
    if rel_bias is not None and not causal:
        raise ValueError("rel_bias applies to causal (decoder self) attention only; pass causal=True or no bias")
    if sliding_window is None:
        return
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 0:
        raise ValueError(f"sliding_window must be an int >= 0 (0 or None = no window), got {sliding_window!r}")
    if sliding_window and not causal:
        raise ValueError("sliding_window applies to causal attention only; pass causal=True or sliding_window=0")


def _attend_reference(q, k, v, causal, sm_scale, out, sliding_window=0, rel_bias=None) -> None:
    """fp32 attention of one sequence: q [n, Hq, D] over k/v [kv_len, Hkv, D] (float32), written into out."""
    q_len, kv_len = q.shape[0], k.shape[0]
    if q_len == 0:
        return
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(torch.float32), k) * sm_scale
    if causal:
        i = torch.arange(q_len, device=q.device)[:, None]
        j = torch.arange(kv_len, device=q.device)[None, :]
        if rel_bias is not None:
            scores = scores + relative_bias_reference(rel_bias, kv_len - q_len + i[:, 0], kv_len)
        scores = scores.masked_fill(j > kv_len - q_len + i, float("-inf"))
        if sliding_window:
            scores = scores.masked_fill(j <= kv_len - q_len + i - sliding_window, float("-inf"))
    out.copy_(torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v).to(out.dtype))


def _validate_paged(q, pool, block_tables, cu_seqlens_q, seq_lens, spec, causal, k_scale, v_scale) -> None:
    check_spec(spec)
    check_float_tensor("q", q, 3)
    check_int_tensor("block_tables", block_tables, torch.int32, 2)
    check_int_tensor("cu_seqlens_q", cu_seqlens_q, torch.int32, 1)
    check_int_tensor("seq_lens", seq_lens, torch.int32, 1)
    capacity = check_pool(pool, spec)
    require_device(q, pool, block_tables, cu_seqlens_q, seq_lens)
    if q.shape[2] != spec.head_size:
        raise ValueError(f"q has head size {q.shape[2]}, the cache {spec.head_size}")
    check_query_against_cache(q, spec, k_scale, v_scale)
    batch = seq_lens.shape[0]
    if cu_seqlens_q.shape[0] != batch + 1 or block_tables.shape[0] != batch:
        raise ValueError(f"seq_lens has {batch} sequences, cu_seqlens_q must have {batch + 1} entries (got "
                         f"{cu_seqlens_q.shape[0]}) and block_tables {batch} rows (got {block_tables.shape[0]})")
    q_lens = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    kv_lens = seq_lens.cpu().to(torch.int64)
    if bool((kv_lens < 0).any()):
        raise ValueError(f"seq_lens must not be negative, got {kv_lens.tolist()}")
    _check_lengths(q_lens, kv_lens, causal)
    check_block_tables(block_tables, seq_lens, spec, capacity)


def paged_context_attention(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, spec, causal: bool, sm_scale: float,
                            k_scale: float = 1.0, v_scale: float = 1.0, validate: bool = True,
                            sliding_window: int = 0, rel_bias: torch.Tensor | None = None,
                            config: launch.ContextConfig | None = None) -> torch.Tensor:
    """Attention of q [Tq, Hq, D] over the first seq_lens[b] cached tokens of each sequence's block table;
    sliding_window, rel_bias and config as in context_attention."""
    if validate:
        _validate_paged(q, pool, block_tables, cu_seqlens_q, seq_lens, spec, causal, k_scale, v_scale)
        _check_window(sliding_window, causal, rel_bias, q)
    q = _last_dim_contiguous(q)
    codes, scales = read_views(pool, spec)
    layer_k = float(k_scale) if spec.fmt == formats.FP8 else 1.0
    spec_fields = (spec.fmt, spec.block_size, element_strides(spec), spec.scale_offset, row_alignment(spec),
                   spec.placement, scale_word_strides(spec)[:2], scale_alignment(spec))
    return _launch(q, q, q, codes, scales, block_tables, cu_seqlens_q, cu_seqlens_q, seq_lens, spec_fields, causal,
                   sm_scale * layer_k, float(v_scale), spec.num_kv_heads, paged=True, window=sliding_window,
                   rel_bias=rel_bias, config=config)


def paged_context_attention_reference(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor,
                                      cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, spec, causal: bool,
                                      sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                                      validate: bool = True, sliding_window: int = 0,
                                      rel_bias: torch.Tensor | None = None, config=None) -> torch.Tensor:
    """context_attention in fp32 torch, one sequence at a time (`config` is accepted and ignored)."""
    if validate:
        _validate_paged(q, pool, block_tables, cu_seqlens_q, seq_lens, spec, causal, k_scale, v_scale)
        _check_window(sliding_window, causal, rel_bias, q)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    cq = cu_seqlens_q.tolist()
    for b, kv_len in enumerate(seq_lens.tolist()):
        k = gather_sequence(pool, spec, block_tables[b], kv_len, 0, k_scale)
        v = gather_sequence(pool, spec, block_tables[b], kv_len, 1, v_scale)
        _attend_reference(q[cq[b]:cq[b + 1]], k, v, causal, sm_scale, out[cq[b]:cq[b + 1]], sliding_window,
                          rel_bias)
    return out

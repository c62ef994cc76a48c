"""write_kv: store new tokens' K and V into their cache slots, quantizing as the pool's format says.
See docs/internals.md#kernels-cache-write."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import formats, launch
from .addressing import (AUTO_DTYPES, BF16, CODE_DTYPES, F16, F32, FP8, INT8_PTH, cache_offset, check_spec,
                         element_strides, half_word_strides, scale_word_strides, scatter_rows, typed_pool,
                         v_element_strides)
from .checks import check_float_tensor, check_int_tensor, check_pool, check_scale
from .mode import require_device
from .quant import quantize_fp8, quantize_int8, quantize_reference, torch_e4m3_saturates


# The quantization limits of the one format table, as Triton compile-time constants.
INT8_QMAX: tl.constexpr = tl.constexpr(formats.INT8_QMAX)
FP8_QMAX: tl.constexpr = tl.constexpr(formats.FP8_QMAX)
SCALE_EPS: tl.constexpr = tl.constexpr(formats.SCALE_EPS)


@triton.jit
def _store_half(x_ptr, stride_t, stride_h, codes_ptr, scales_ptr, rows, elem_stride, scale_words, row_mask, t, h, d,
                layer_scale, FMT: tl.constexpr, HEAD_SIZE: tl.constexpr, SATURATE: tl.constexpr):
    """Quantize and store one of K or V for a [BLOCK_T, BLOCK_H, D] tile; `rows` are element offsets [T, H] of each
    row's first code, `elem_stride` the step to the next, `scale_words` the fp32-word offsets of their scales [T, H]
    (per-token-head formats)."""
    mask = row_mask[:, :, None] & (d < HEAD_SIZE)[None, None, :]
    x = tl.load(x_ptr + t[:, None, None] * stride_t + h[None, :, None] * stride_h + d[None, None, :], mask=mask)
    dst = codes_ptr + rows[:, :, None] + d[None, None, :] * elem_stride
    if FMT == F16 or FMT == BF16 or FMT == F32:     # stored as is
        tl.store(dst, x, mask=mask)
    elif FMT == FP8:                                 # one scale per layer
        y = tl.math.div_rn(x.to(tl.float32), layer_scale)
        tl.store(dst, quantize_fp8(y, SATURATE), mask=mask)
    else:                                            # per token-head: scale from the row's amax
        xf = x.to(tl.float32)
        if FMT == INT8_PTH:
            qmax = INT8_QMAX
        else:
            qmax = FP8_QMAX
        amax = tl.max(tl.abs(xf), axis=2)
        scale = tl.maximum(tl.math.div_rn(amax, qmax), SCALE_EPS)
        y = tl.math.div_rn(xf, scale[:, :, None])
        if FMT == INT8_PTH:
            tl.store(dst, quantize_int8(y), mask=mask)
        else:
            tl.store(dst, quantize_fp8(y, SATURATE), mask=mask)
        tl.store(scales_ptr + scale_words, scale, mask=row_mask)


@triton.jit
def _write_kv_kernel(key_ptr, value_ptr, codes_ptr, scales_ptr, slot_mapping_ptr, num_tokens,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     block_stride, kv_stride, slot_stride, row_stride, v_slot_stride, v_head_stride, v_elem_stride,
                     scale_slot_words, scale_head_words, scale_first_word, block_words, kv_words, k_scale, v_scale,
                     FMT: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                     SATURATE: tl.constexpr):
    launch.wait_for_inputs()
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_SIZE)
    slot = tl.load(slot_mapping_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    write = slot >= 0
    safe = tl.where(write, slot, 0)
    block, in_block, head = (safe // BLOCK_SIZE)[:, None], (safe % BLOCK_SIZE)[:, None], h[None, :].to(tl.int64)
    rows = cache_offset(block, in_block, head * row_stride, block_stride, slot_stride)
    v_rows = cache_offset(block, in_block, head * v_head_stride, block_stride, v_slot_stride) + kv_stride
    # scale words of either placement, from the spec's strides (formats.CacheSpec)
    scale_words = cache_offset(block, in_block, head * scale_head_words + scale_first_word, block_words,
                               scale_slot_words)
    row_mask = write[:, None] & (h < NUM_HEADS)[None, :]
    _store_half(key_ptr, stride_kt, stride_kh, codes_ptr, scales_ptr, rows, 1, scale_words, row_mask, t, h, d,
                k_scale, FMT, HEAD_SIZE, SATURATE)
    _store_half(value_ptr, stride_vt, stride_vh, codes_ptr, scales_ptr, v_rows, v_elem_stride, scale_words + kv_words,
                row_mask, t, h, d, v_scale, FMT, HEAD_SIZE, SATURATE)


def _validate(key, value, pool, slot_mapping, spec, k_scale, v_scale) -> None:
    check_float_tensor("key", key, 3)
    check_float_tensor("value", value, 3)
    check_int_tensor("slot_mapping", slot_mapping, torch.int64, 1)
    capacity = check_pool(pool, spec)
    require_device(key, value, pool, slot_mapping)
    expected = (key.shape[0], spec.num_kv_heads, spec.head_size)
    if tuple(key.shape) != expected or tuple(value.shape) != expected:
        raise ValueError(f"key and value must be [num_tokens, num_kv_heads, head_size] = {list(expected)}, "
                         f"got {list(key.shape)} and {list(value.shape)}")
    if key.dtype != value.dtype:
        raise TypeError(f"key and value must share a dtype, got {key.dtype} and {value.dtype}")
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    if spec.fmt in AUTO_DTYPES and key.dtype != AUTO_DTYPES[spec.fmt]:
        raise ValueError(f"a {formats.NAMES[spec.fmt]} cache stores its elements as is, so key/value must be "
                         f"{AUTO_DTYPES[spec.fmt]}, got {key.dtype}")
    if spec.fmt == formats.FP8:
        check_scale("k_scale", k_scale)
        check_scale("v_scale", v_scale)
    slots = slot_mapping.cpu()
    bad = (slots < -1) | (slots >= capacity * spec.block_size)
    if bool(bad.any()):
        raise ValueError(f"slot {int(slots[bad][0])} is outside the pool ({capacity} blocks x {spec.block_size} "
                         f"slots; -1 skips a token)")


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def write_kv(key: torch.Tensor, value: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor, spec,
             k_scale: float = 1.0, v_scale: float = 1.0, validate: bool = True,
             config: launch.WriteConfig | None = None, num_programs: int | None = None) -> None:
    """Write key/value [T, num_kv_heads, head_size] into `pool` at `slot_mapping` (int64 [T], -1 = skip)."""
    spec = check_spec(spec)
    if validate:
        _validate(key, value, pool, slot_mapping, spec, k_scale, v_scale)
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    cfg = config or launch.write_config(num_tokens, spec.num_kv_heads, spec.head_size)
    grid = triton.cdiv(num_tokens, cfg.block_t)
    if num_programs is not None:
        if isinstance(num_programs, bool) or not isinstance(num_programs, int) or not 1 <= num_programs <= grid:
            raise ValueError(f"num_programs must be an int from 1 to the grid's {grid} programs, got {num_programs!r}")
        grid = num_programs
    key, value = _last_dim_contiguous(key), _last_dim_contiguous(value)
    code_dtype = torch.uint8 if CODE_DTYPES[spec.fmt] == torch.float8_e4m3fn else CODE_DTYPES[spec.fmt]
    codes = typed_pool(pool, code_dtype)
    scales = typed_pool(pool, torch.float32) if formats.has_inline_scales(spec.fmt) else codes
    _write_kv_kernel[(grid,)](
        key, value, codes, scales, slot_mapping, num_tokens,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *element_strides(spec), *v_element_strides(spec), *scale_word_strides(spec), *half_word_strides(spec),
        float(k_scale), float(v_scale),
        FMT=spec.fmt, NUM_HEADS=spec.num_kv_heads, HEAD_SIZE=spec.head_size, BLOCK_SIZE=spec.block_size,
        BLOCK_T=cfg.block_t, BLOCK_H=cfg.block_h, SATURATE=torch_e4m3_saturates(key.device.type),
        num_warps=cfg.num_warps, **launch.PDL_LAUNCH)


def write_kv_reference(key: torch.Tensor, value: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor,
                       spec, k_scale: float = 1.0, v_scale: float = 1.0, validate: bool = True) -> None:
    """write_kv in torch: quantize, then scatter the codes' and scales' bytes into the pool."""
    spec = check_spec(spec)
    if validate:
        _validate(key, value, pool, slot_mapping, spec, k_scale, v_scale)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for kv, (x, layer_scale) in enumerate(((key, k_scale), (value, v_scale))):
        x = x[keep]
        if spec.fmt in AUTO_DTYPES:
            codes, scales = x.to(AUTO_DTYPES[spec.fmt]), None
        else:
            codes, scales = quantize_reference(x.to(torch.float32), spec.fmt, layer_scale)
        scatter_rows(pool, spec, slots, kv, codes, scales)

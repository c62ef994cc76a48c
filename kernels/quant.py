"""Quantization arithmetic: float32 -> e4m3 bits, round-half-even, per-token-head scales (Triton and torch).
See docs/internals.md#kernels-quant."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import formats


@triton.jit
def e4m3_bits(x, SATURATE: tl.constexpr):
    """int32 e4m3fn bit pattern (0..255) of float32 `x`, rounded to nearest even like torch's cast."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # denormal range: 2**14 + |x| rounds |x| to a multiple of 2**-9; the low bits are the code
    shifted = mag.to(tl.float32, bitcast=True) + 16384.0
    denormal = shifted.to(tl.int32, bitcast=True) - (141 << 23)
    # normal range: rebias the exponent, round the mantissa to 3 bits (ties to the even code)
    odd = (mag >> 20) & 1
    normal = (mag - (120 << 23) + 0x7FFFF + odd) >> 20
    code = tl.where(mag < (121 << 23), denormal, normal)
    if SATURATE:
        # a mantissa that rounds up into the NaN pattern, finite overflow and infinities all become 448
        code = tl.where(code == 0x7F, 0x7E, code)
        overflow = tl.where(mag > 0x7F800000, 0x7F, 0x7E)
    else:
        overflow = tl.full(mag.shape, 0x7F, tl.int32)
    code = tl.where(mag >= (1087 << 20), overflow, code)
    return code | sign


@triton.jit
def round_half_even(y):
    """float32 `y` rounded to the nearest integer, ties to even, returned as int32 (|y| < 2**31)."""
    t = y.to(tl.int32)                      # truncates toward zero
    frac = y - t.to(tl.float32)             # exact
    step = tl.where(y < 0, -1, 1)
    away = (tl.abs(frac) > 0.5) | ((tl.abs(frac) == 0.5) & ((t & 1) != 0))
    return tl.where(away, t + step, t)


@triton.jit
def quantize_int8(y):
    """int8 code of float32 `y` (already divided by its scale): round half to even, clamp to [-128, 127]."""
    y = tl.minimum(tl.maximum(y, -128.0), 127.0)
    return round_half_even(y).to(tl.int8)


@triton.jit
def quantize_fp8(y, SATURATE: tl.constexpr):
    """uint8 e4m3 code of float32 `y` (already divided by its scale), clamped to [-448, 448] first."""
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    return e4m3_bits(y, SATURATE).to(tl.uint8)


@triton.jit
def _encode_e4m3_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, SATURATE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, e4m3_bits(x, SATURATE).to(tl.uint8), mask=mask)


def encode_e4m3(x: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """uint8 e4m3fn codes of a float32 tensor, through the Triton encoder (no clamping: raw cast semantics)."""
    from .mode import INTERPRETED, require_device
    if x.dtype != torch.float32:
        raise TypeError(f"encode_e4m3 takes float32, got {x.dtype}")
    require_device(x)
    flat = x.contiguous().reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
    if block is None:
        block = 1 << 16 if INTERPRETED else 1024
    grid = (triton.cdiv(flat.numel(), block),)
    if flat.numel():
        _encode_e4m3_kernel[grid](flat, out, flat.numel(), BLOCK=block,
                                  SATURATE=torch_e4m3_saturates(x.device.type))
    return out.reshape(x.shape)


def encode_e4m3_reference(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn).view(torch.uint8)


@functools.cache
def torch_e4m3_saturates(device_type: str) -> bool:
    """Whether this torch casts finite overflow (e.g. 470.0) to 448 (0x7E) rather than NaN (0x7F) on a device."""
    probe = torch.tensor([470.0], dtype=torch.float32, device=device_type)
    return int(probe.to(torch.float8_e4m3fn).view(torch.uint8).item()) == 0x7E


def per_token_head_scales_reference(x: torch.Tensor, fmt: int) -> torch.Tensor:
    """fp32 [..., H]: scale = max(amax(|x|) / QMAX, SCALE_EPS) over the last dimension of float32 `x`."""
    qmax = torch.tensor(formats.qmax(fmt), dtype=torch.float32, device=x.device)
    return torch.clamp(x.abs().amax(dim=-1) / qmax, min=formats.SCALE_EPS)


def quantize_reference(x: torch.Tensor, fmt: int, layer_scale: float = 1.0):
    """(codes, scales) of float32 `x` [..., D] in a quantized format; scales is None for fp8 per-layer."""
    if fmt == formats.FP8:
        y = x / torch.tensor(layer_scale, dtype=torch.float32, device=x.device)
        return y.clamp(-formats.FP8_QMAX, formats.FP8_QMAX).to(torch.float8_e4m3fn), None
    scales = per_token_head_scales_reference(x, fmt)
    y = x / scales[..., None]
    if fmt == formats.INT8_PTH:
        codes = torch.round(y).clamp(-128, 127).to(torch.int8)
    elif fmt == formats.FP8_PTH:
        codes = y.clamp(-formats.FP8_QMAX, formats.FP8_QMAX).to(torch.float8_e4m3fn)
    else:
        raise ValueError(f"format {formats.NAMES.get(fmt, fmt)} is not a quantized format")
    return codes, scales

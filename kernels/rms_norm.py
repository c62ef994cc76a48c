"""rms_norm: Gemma's RMSNorm in one launch, with the steps that follow it in the model fused in when asked, or a
layer's q, k and v norms in one launch.
See docs/internals.md#kernels-rms-norm."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launch
from .errors import InvalidTypeError, InvalidValueError
from .mode import require_device


@triton.jit
def _round(x, DTYPE: tl.constexpr):
    """x (float32) rounded to DTYPE and back: what storing it in a DTYPE tensor keeps."""
    return x.to(DTYPE).to(tl.float32)


@triton.jit
def _weight(weight_ptr, k_weight_ptr, d, head, q_heads, roped_heads, D: tl.constexpr, QKV: tl.constexpr):
    """Each row's weight at d: one for all rows; with QKV, q's for heads below q_heads, then k's up to roped_heads,
    then 1 (v's norm has no weight)."""
    w = tl.load(weight_ptr + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
    if QKV:
        w_k = tl.load(k_weight_ptr + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
        w = tl.where((head < q_heads)[:, None], w, tl.where((head < roped_heads)[:, None], w_k, 1.0))
    return w


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, k_weight_ptr, residual_ptr, cos_ptr, sin_ptr, scale_ptr, next_weight_ptr,
                     out_ptr, next_out_ptr, rows, rows_per_token, q_heads, roped_heads, eps, D: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     HAS_RESIDUAL: tl.constexpr, HAS_ROPE: tl.constexpr, HAS_SCALE: tl.constexpr,
                     HAS_NEXT: tl.constexpr, QKV: tl.constexpr):
    launch.wait_for_inputs()
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    head = r % rows_per_token
    mask = (r < rows)[:, None] & (d < D)[None, :]
    at = r.to(tl.int64)[:, None] * D + d[None, :]
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    y = x * inv_rms[:, None]
    if HAS_WEIGHT:
        y = y * _weight(weight_ptr, k_weight_ptr, d, head, q_heads, roped_heads, D, QKV)
    y = _round(y, dtype)
    if HAS_ROPE:
        # RoPE pairs element i with i + D/2: the partner's normed value is computed from its own load of x (the
        # row is in L1), then out = y * cos + rotate_half(y) * sin, each product and the sum rounded as torch does
        half: tl.constexpr = D // 2
        partner = (d + half) % D
        x_p = tl.load(x_ptr + r.to(tl.int64)[:, None] * D + partner[None, :], mask=mask, other=0.0).to(tl.float32)
        y_p = x_p * inv_rms[:, None]
        if HAS_WEIGHT:
            y_p = y_p * _weight(weight_ptr, k_weight_ptr, partner, head, q_heads, roped_heads, D, QKV)
        y_p = _round(y_p, dtype)
        rotated = tl.where((d < half)[None, :], -y_p, y_p)
        token = (r // rows_per_token).to(tl.int64)[:, None] * D + d[None, :]
        cos = tl.load(cos_ptr + token, mask=mask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + token, mask=mask, other=0.0).to(tl.float32)
        roped = _round(_round(y * cos, dtype) + _round(rotated * sin, dtype), dtype)
        y = tl.where((head < roped_heads)[:, None], roped, y)                # QKV: v's heads have no RoPE
    if HAS_RESIDUAL:
        y = _round(tl.load(residual_ptr + at, mask=mask, other=0.0).to(tl.float32) + y, dtype)
    if HAS_SCALE:
        y = _round(y * tl.load(scale_ptr).to(tl.float32), dtype)
    tl.store(out_ptr + at, y.to(dtype), mask=mask)
    if HAS_NEXT:
        # the norm that reads this output next, from the rounded values a second launch would load: the same
        # operations in the same order (one launch config per shape), so the same bits
        inv_next = tl.math.rsqrt(tl.sum(y * y, axis=1) / D + eps)
        z = y * inv_next[:, None] * tl.load(next_weight_ptr + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
        tl.store(next_out_ptr + at, z.to(dtype), mask=mask)


def _check(x, weight, eps, residual, cos, sin, scale=None, next_weight=None, kv=None) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise InvalidTypeError(f"x must be a floating-point tensor, got {type(x).__name__} "
                               f"{getattr(x, 'dtype', '')}")
    if not isinstance(eps, float) or not eps > 0:
        raise InvalidValueError(f"eps must be a positive float, got {eps!r}")
    d = x.shape[-1]
    for name, w in (("weight", weight), ("next_weight", next_weight)):
        if w is not None and (not isinstance(w, torch.Tensor) or tuple(w.shape) != (d,)):
            raise InvalidValueError(f"{name} must be a tensor of shape [{d}], got {getattr(w, 'shape', w)}")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x.shape
                                 or residual.dtype != x.dtype):
        raise InvalidValueError(f"residual must match x ({x.dtype} {list(x.shape)}), got "
                                f"{getattr(residual, 'dtype', '')} {list(getattr(residual, 'shape', []))}")
    if scale is not None and (not isinstance(scale, torch.Tensor) or scale.numel() != 1 or scale.dtype != x.dtype):
        raise InvalidValueError(f"scale must be a one-element {x.dtype} tensor, got {getattr(scale, 'dtype', '')} "
                                f"{list(getattr(scale, 'shape', [scale]))}")
    if (cos is None) != (sin is None):
        raise InvalidValueError("cos and sin come together (RoPE), or neither")
    if cos is not None:
        if residual is not None or next_weight is not None:
            raise InvalidValueError("RoPE is never fused with a residual or a next norm: the model has no such step")
        if x.dim() < 2 or d % 2:
            raise InvalidValueError(f"RoPE needs x [..., heads, D] with an even D, got {list(x.shape)}")
        want = (*x.shape[:-2], d)
        for name, t in (("cos", cos), ("sin", sin)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != x.dtype:
                raise InvalidValueError(f"{name} must be {x.dtype} of shape {list(want)} (x's without the heads), "
                                        f"got {getattr(t, 'dtype', '')} {list(getattr(t, 'shape', []))}")
    if kv is not None and (cos is None or weight is None or scale is not None or not isinstance(kv[0], torch.Tensor)
                           or tuple(kv[0].shape) != (d,) or not 0 < 2 * kv[1] < x.shape[-2]):
        raise InvalidValueError(f"kv= takes cos, sin, q's weight, no scale, and (k's weight [{d}], kv heads below "
                                f"{x.shape[-2]} / 2), got {getattr(kv[0], 'shape', kv[0])} and {kv[1]}")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                       residual: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                       sin: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                       kv: tuple[torch.Tensor, int] | None = None, validate: bool = True) -> torch.Tensor:
    """The torch formula: RMSNorm in float32 rounded to x's dtype, then RoPE or residual + the norm, then times
    `scale` (a one-element tensor: Gemma-4's layer scalar). kv=(k_weight, kv_heads): x [..., heads, D] holds q's
    heads, then kv_heads of k, then kv_heads of v: q's norm (weight, RoPE), k's (k_weight, RoPE), v's (neither)."""
    if validate:
        _check(x, weight, eps, residual, cos, sin, scale, kv=kv)
    if kv is not None:
        q, k, v = x.split([x.shape[-2] - 2 * kv[1], kv[1], kv[1]], dim=-2)
        roped = lambda t, w: rms_norm_reference(t, w, eps, cos=cos, sin=sin, validate=False)
        return torch.cat([roped(q, weight), roped(k, kv[0]), rms_norm_reference(v, None, eps)], dim=-2)
    xf = x.float()
    out = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        out = out * weight.float()
    out = out.to(x.dtype)
    if cos is not None:
        half = out.shape[-1] // 2
        rotated = torch.cat([-out[..., half:], out[..., :half]], dim=-1)
        out = out * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)
    if residual is not None:
        out = residual + out
    return out if scale is None else out * scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
             cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, scale: torch.Tensor | None = None,
             next_weight: torch.Tensor | None = None, kv: tuple[torch.Tensor, int] | None = None,
             validate: bool = True):
    """rms_norm_reference's result from one kernel launch (compiled on CUDA, interpreted on a CPU). With
    `next_weight`: (that result, its RMSNorm with `next_weight` and eps), the model's next norm in the same launch."""
    if validate:
        _check(x, weight, eps, residual, cos, sin, scale, next_weight, kv)
        require_device(*(t for t in (x, weight, residual, cos, sin, scale, next_weight, *(kv or ())[:1])
                         if t is not None))
    d = x.shape[-1]
    x2 = x.contiguous()
    out = torch.empty_like(x2)
    next_out = torch.empty_like(x2) if next_weight is not None else out
    rows = x2.numel() // d
    if rows == 0:
        return out if next_weight is None else (out, next_out)
    cfg = launch.norm_config(rows, d)
    rows_per_token = x.shape[-2] if cos is not None else 1
    q_heads, roped_heads = (rows_per_token - 2 * kv[1], rows_per_token - kv[1]) if kv else (rows_per_token,) * 2
    cos_c = cos.contiguous() if cos is not None else x2
    sin_c = sin.contiguous() if sin is not None else x2
    _rms_norm_kernel[(triton.cdiv(rows, cfg.block_r),)](
        x2, weight if weight is not None else x2, kv[0] if kv else x2,
        residual.contiguous() if residual is not None else x2, cos_c, sin_c, scale if scale is not None else x2,
        next_weight if next_weight is not None else x2, out, next_out, rows, rows_per_token, q_heads, roped_heads,
        float(eps), D=d, BLOCK_D=cfg.block_d, BLOCK_R=cfg.block_r, HAS_WEIGHT=weight is not None,
        HAS_RESIDUAL=residual is not None, HAS_ROPE=cos is not None, HAS_SCALE=scale is not None,
        HAS_NEXT=next_weight is not None, QKV=kv is not None, num_warps=cfg.num_warps, **launch.PDL_LAUNCH)
    return out if next_weight is None else (out, next_out)

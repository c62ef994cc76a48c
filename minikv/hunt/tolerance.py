"""The kernel-level oracles' tolerances, derived from the case itself (no constant fitted to any run): one
quantization step for the cache write (`code_step`), float64 magnitudes and the compute dtype's rounding for
attention (`attention_bound`, whose docstring works the bound out).
"""
from __future__ import annotations

import torch

from minikv.kernels import addressing, formats

UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
U32 = 2.0 ** -24


def e4m3_spacing(c: torch.Tensor) -> torch.Tensor:
    """The gap between e4m3 codes around magnitude |c| (the larger gap at a power of two)."""
    exponent = torch.floor(torch.log2(c.abs().clamp_min(2.0 ** -6)))
    return torch.pow(2.0, exponent - 3)


def code_step(want: torch.Tensor, fmt: int, ref_pool, spec, slots, kv: int, layer: float):
    """Allowed |stored - reference| per element (float64 like `want`), or None: the bytes must be equal.

    A backend may round a value to the neighbouring code, so each stored element may differ from minikv's reference
    writer's by one step of the format at that magnitude: none for the 16-bit formats (the bytes must be equal),
    1 x the row's scale for int8, the e4m3 spacing at the code (2^(e-3), 2^-9 below 2^-6) x the scale for fp8, plus
    2^-22 of the value for a scale computed with another rounding.
    """
    if fmt in (formats.F16, formats.BF16, formats.F32):
        return None
    codes, scales = addressing.gather_rows(ref_pool, spec, slots, kv)
    c = codes.to(torch.float64)
    scale = layer if scales is None else scales.to(torch.float64)[..., None]
    step = torch.ones_like(c) if fmt == formats.INT8_PTH else e4m3_spacing(c)
    return step * scale + want.abs() * 2.0 ** -22


def attention_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, sm_scale: float,
                    dtype: torch.dtype):
    """(float64 attention output [n, Hq, D], its tolerance) of one request: q [n, Hq, D] in the compute dtype,
    k/v float64 [L, Hkv, D], visible bool [n, L].

    On the K/V the pool holds (exact, in float64), let u be the unit roundoff of the compute dtype (2^-24
    float32, 2^-11 float16, 2^-8 bfloat16) and u32 = 2^-24 (products summed in float32, as matmul units
    accumulate). Each K and V element is rounded once to the compute dtype (u), each product once (u), the D-term
    sums carry D u32, the score is rounded (u) and the exponent's argument s - max too (u), so

        |ds_j| <= sm sum_d |q_d k_jd| (2u + D u32) + (|s_j| + |s_j - max s|) u =: Delta_j .

    Scores off by at most Delta move each probability by a factor within exp(+-2 Delta); as both sets of
    probabilities sum to 1, o' - o = sum_j (p'_j - p_j)(v_j - o), so the output moves by at most
    expm1(2 max Delta) sum_j p_j |v_j - o| (0 for a single visible key). P and V are rounded (u each), the
    L-term sum carries L u32 and the output is rounded (u); a probability within one binade of the dtype's
    smallest normal number (times exp(2 Delta)) may come out as zero, losing its p_j |v_j| (a vectorized exp
    builds 2^n 2^f and flushes once n reaches the exponent's floor; subnormals may be flushed):
        tol = expm1(2 Delta) sum_j p_j |v_j - o| + sum_j p_j |v_j| (2u + L u32) + |o| u
              + sum_{j: p_j < 2 tiny exp(2 Delta)} p_j |v_j|.
    """
    u = UNIT_ROUNDOFF[dtype]
    heads, d = q.shape[1:]
    length = k.shape[0]
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    q64 = q.to(torch.float64)
    s = sm_scale * torch.einsum("qhd,khd->hqk", q64, k)
    a = sm_scale * torch.einsum("qhd,khd->hqk", q64.abs(), k.abs())
    s = s.masked_fill(~visible[None], float("-inf"))
    top = s.amax(dim=-1, keepdim=True)
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("hqk,khd->qhd", p, v)
    delta = a * (2 * u + d * U32) + (s.abs() + (s - top).abs()) * u
    delta = delta.masked_fill(~visible[None], 0).amax(dim=-1)                 # [Hq, n]
    spread = torch.empty_like(o)                                             # sum_j p_j |v_j - o|, [n, Hq, D]
    for row in range(0, o.shape[0], 16):                                    # in chunks: [16, Hq, L, D] at most
        rows = slice(row, row + 16)
        dev = (v.transpose(0, 1)[None] - o[rows, :, None, :]).abs()          # [r, Hq, L, D]
        spread[rows] = torch.einsum("hqk,qhkd->qhd", p[:, rows], dev)
    pv = torch.einsum("hqk,khd->qhd", p, v.abs())
    tiny = 2 * torch.finfo(dtype).tiny * torch.exp(2 * delta)[..., None]   # [Hq, n, 1]
    flushed = torch.einsum("hqk,khd->qhd", p * (p < tiny), v.abs())
    tol = (torch.expm1(2 * delta).transpose(0, 1)[..., None] * spread + pv * (2 * u + length * U32) + o.abs() * u
           + flushed)
    return o, tol

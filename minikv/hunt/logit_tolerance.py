"""How far a correct engine's logits may lie from the float64 dense reference's: the rule, from first principles.
See docs/internals.md#hunt-logit-tolerance and docs/hunt.md, "How close is close enough"."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# Unit roundoff (half the distance from 1 to the next float) of each activation dtype.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
SAFETY = 2.0              # the measured terms are estimates of a bound, not bounds: twice each
SAMPLES = 8               # runs of the float64 model with random rounding (RandomRounding), per reference


@dataclass(frozen=True)
class Terms:
    layers: int           # L: the model's layers (encoder and decoder for T5)
    inner: int            # n: its longest dot product (the widest linear layer's input)
    gamma: float          # (L + 1) * sqrt(n)
    u: float              # the activation dtype's unit roundoff
    bound: float          # max_v |W_v| |h|: no logit of the row can be larger
    compute: float        # gamma * u * max_v |W_v| |h|
    own: float            # how far the dense model's own run in the activation dtype lies from float64
    flip: float           # the sum of the logits' moves, each group of codes its rounding could flip flipped alone
    spread: float         # the largest move over SAMPLES runs of the float64 model rounding at random (RandomRounding)
    total: float          # SAFETY * (compute + max(own, spread) + flip)


def gamma(layers: int, inner: int) -> float:
    """How many unit roundoffs the final hidden state may be off by, relatively: each of the `layers` layers (and
    the embedding) rounds once more, and a dot product of n terms accumulates rounding errors growing like
    sqrt(n) (independent roundings; n * u is the worst case, rarely approached)."""
    return (layers + 1) * math.sqrt(inner)


def terms(dtype: str, layers: int, inner: int, bound: float, own: float, flip: float, spread: float) -> Terms:
    """The tolerance of one row, for an engine computing in `dtype` with a model of `layers` layers whose longest
    dot product is `inner`; measured on the reference: `bound` = max_v |W_v| |h|, `own` the dense model's own run
    in `dtype`, `flip` (`FlipProbe`) and `spread` (`RandomRounding`). own and spread estimate the same thing, how
    far rounding in `dtype` moves the row, one from a single real run, the other from SAMPLES random ones: the
    larger counts."""
    g = gamma(layers, inner)
    compute = g * UNIT_ROUNDOFF[dtype] * bound
    total = SAFETY * (compute + max(own, spread) + flip)
    return Terms(layers, inner, g, UNIT_ROUNDOFF[dtype], bound, compute, own, flip, spread, total)


class RandomRounding(TorchFunctionMode):
    """Inside it, a float64 model's dot products round as an activation dtype of unit roundoff `u` may: each
    product a_j b_j of a dot product of n terms carries its own relative error, drawn uniformly from
    [-sqrt(n) u, sqrt(n) u] (the n additions it passes through round independently: a random walk, as in gamma),
    so that the result moves by sqrt(n) u sqrt(sum_j (a_j b_j)^2) times a uniform draw from [-1, 1]. The errors
    scale with the terms, not with the result: where a dot product cancels (a small output from large terms) and a
    norm then scales the small output up, the error grows with it, which gamma, a bound on the final hidden state,
    cannot see. Linear layers, matmuls and scaled_dot_product_attention (its scores and its weighted sum of V) are
    the dot products; every other op is left exact. Seeded: the same model and input give the same draws."""

    def __init__(self, u: float, seed: int = 0):
        super().__init__()
        self.u, self.generator = u, torch.Generator().manual_seed(seed)

    def _rounded(self, exact: torch.Tensor, squares: torch.Tensor, n: int) -> torch.Tensor:
        draw = torch.rand(exact.shape, generator=self.generator, dtype=exact.dtype) * 2 - 1
        return exact + self.u * math.sqrt(n) * squares.sqrt() * draw.to(exact.device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], (args[1] if len(args) > 1 else kwargs["weight"])
            return self._rounded(func(*args, **kwargs), F.linear(x * x, w * w), x.shape[-1])
        if func in (torch.matmul, torch.Tensor.__matmul__, torch.bmm):
            a, b = args[0], args[1]
            return self._rounded(func(a, b), func(a * a, b * b), a.shape[-1])
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        return func(*args, **kwargs)

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        assert dropout_p == 0.0 and not is_causal, "the dense models pass a mask and no dropout"
        if q.shape[-3] != k.shape[-3]:                               # GQA: each KV head serves a group of queries
            k, v = (t.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) for t in (k, v))
        kt = k.transpose(-1, -2)
        scores = self._rounded(q @ kt, (q * q) @ (kt * kt), q.shape[-1]) * (q.shape[-1] ** -0.5 if scale is None
                                                                          else scale)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
                else scores + attn_mask
        weights = scores.softmax(-1)
        return self._rounded(weights @ v, (weights * weights) @ (v * v), k.shape[-2])


def _codes(x: torch.Tensor, fmt: str):
    """(the code x rounds to, the neighbouring code on x's side, x itself) in code units, and the scale: float64."""
    from minikv.kernels import formats
    from minikv.kernels.quant import quantize_reference
    codes, scales = quantize_reference(x.float(), formats.format_of(fmt, torch.float32).code)
    scale = torch.ones_like(x[..., :1]) if scales is None else scales.double()[..., None]
    y, near = x / scale, codes.double()
    if codes.dtype == torch.int8:
        other = (near + torch.where(y >= near, 1.0, -1.0)).clamp(-128, 127)
    else:                                       # e4m3: the next magnitude up or down, same sign
        bits = codes.view(torch.uint8).to(torch.int16)
        magnitude, sign = bits & 0x7F, bits & 0x80
        outward = y.abs() >= near.abs()
        magnitude = torch.where(outward, (magnitude + 1).clamp(max=0x7E), (magnitude - 1).clamp(min=0))
        other = (sign | magnitude).to(torch.uint8).view(torch.float8_e4m3fn).double()
    return near, other, y, scale


def flip_near(fmt: str, within: float):
    """A K/V transform for the dense model: each element quantized as format `fmt` stores it, except that an element
    within `within` of the boundary between two codes takes the code on the other side: what an engine whose K and
    V are off by that much may store."""
    def transform(t: torch.Tensor) -> torch.Tensor:
        near, other, y, scale = _codes(t.double(), fmt)
        close = (y - (near + other) / 2).abs() * scale <= within
        return (torch.where(close, other, near) * scale).to(t.dtype)
    return transform


class FlipProbe:
    """The codes an engine's rounding could flip, one group at a time (a group: the codes of one K or V tensor).
    `lower` holds, per K or V tensor in call order, that tensor in the runs that round (the dense model's own run in
    the activation dtype and the RandomRounding runs, along the batch); an element of the reference's is within
    reach of a boundary when it lies within SAFETY times the largest |lower - reference| of its tensor. Called as a
    K/V transform it quantizes as the format does and notes those groups; `flipping()` is then the transform for a
    batch holding the sequence once unchanged (element 0) and once per group, with that group and only it flipped:
    flips in different layers, one layer at a time, cannot cancel each other, so the sum of their moves bounds (to
    first order) a subset's spread over layers."""

    def __init__(self, fmt: str, lower: list[torch.Tensor]):
        self.fmt, self.lower = fmt, lower
        self.groups: list[int] = []                      # the K/V tensors (in call order) with a code in reach
        self.within: list[float] = []                    # per K/V tensor: the distance to a boundary in reach
        self._calls = 0

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.within.append(SAFETY * float((self.lower[self._calls].double() - t.double()).abs().max()))
        near, far = flip_near(self.fmt, 0.0)(t), flip_near(self.fmt, self.within[-1])(t)
        if bool((near != far).any()):
            self.groups.append(self._calls)
        self._calls += 1
        return near

    def flipping(self):
        calls = [0]

        def transform(t: torch.Tensor) -> torch.Tensor:
            near = flip_near(self.fmt, 0.0)(t)
            far = flip_near(self.fmt, self.within[calls[0]])(t)
            if calls[0] in self.groups:
                element = 1 + self.groups.index(calls[0])
                near[element] = far[element]
            calls[0] += 1
            return near
        return transform

"""How far a correct engine's logits may lie from the float64 dense reference's: the rule, from first principles.
See docs/internals.md#hunt-logit-tolerance and docs/hunt.md, "How close is close enough"."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Unit roundoff (half the distance from 1 to the next float) of each activation dtype.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
SAFETY = 2.0              # the measured terms are estimates of a bound, not bounds: twice each


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
    total: float          # SAFETY * (compute + own + flip)


def gamma(layers: int, inner: int) -> float:
    """How many unit roundoffs the final hidden state may be off by, relatively: each of the `layers` layers (and
    the embedding) rounds once more, and a dot product of n terms accumulates rounding errors growing like
    sqrt(n) (independent roundings; n * u is the worst case, rarely approached)."""
    return (layers + 1) * math.sqrt(inner)


def terms(dtype: str, layers: int, inner: int, bound: float, own: float, flip: float) -> Terms:
    """The tolerance of one row, for an engine computing in `dtype` with a model of `layers` layers whose longest
    dot product is `inner`; measured on the reference: `bound` = max_v |W_v| |h|, `own` the dense model's own run
    in `dtype` and `flip` (`flip_near`)."""
    g = gamma(layers, inner)
    compute = g * UNIT_ROUNDOFF[dtype] * bound
    return Terms(layers, inner, g, UNIT_ROUNDOFF[dtype], bound, compute, own, flip, SAFETY * (compute + own + flip))


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
    """The codes an engine's rounding could flip, one group at a time (a group: the codes of one K or V tensor). `lower` holds the K and V tensors of the dense model's own run in the activation dtype, in call order;
    an element of the reference's is within reach of a boundary when it lies within SAFETY times the largest
    |lower - reference| of its tensor. Called as a K/V transform it quantizes as the format does and notes those
    groups; `flipping()` is then the transform for a batch holding the sequence once unchanged (element 0) and
    once per group, with that group and only it flipped: flips in different layers, one layer at a time, cannot
    cancel each other, so the sum of their moves bounds (to first order) a subset's spread over layers."""

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

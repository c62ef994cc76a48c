"""Property tests: what write_kv stores dequantizes back within each format's error bound.

    int8 per token-head   |x - code * scale| <= scale / 2                     (per element)
    fp8  (either scaling) |x - code * scale| <= |x| * 2**-4 + scale * 2**-10  (3 mantissa bits; denormal step 2**-9)
    scale                 = max(amax(|x|) / QMAX, SCALE_EPS) exactly
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from conftest import make_spec
from minikv.kernels import formats, write_kv
from minikv.kernels.addressing import gather_rows

HEAD_SIZE = 16
SLOT = torch.tensor([3])
PROPERTY = settings(max_examples=30, deadline=None, derandomize=True)

head_vectors = arrays(np.float32, (2, HEAD_SIZE),
                      elements=st.floats(-6e4, 6e4, allow_nan=False, allow_infinity=False, width=32))
magnitudes = st.sampled_from([1e-6, 1e-2, 1.0, 300.0, 6e4])


def _round_trip(kv_cache_dtype: str, x: torch.Tensor, layer_scale: float = 1.0):
    spec = make_spec(kv_cache_dtype, torch.float32, 2, HEAD_SIZE, 8)
    pool = torch.zeros(1, spec.block_bytes, dtype=torch.uint8)
    write_kv(x[None], x[None], pool, SLOT, spec, layer_scale, layer_scale)
    codes, scales = gather_rows(pool, spec, SLOT, 0)
    codes = codes[0].to(torch.float64)
    scales = scales[0].to(torch.float64) if scales is not None else torch.full((2,), layer_scale, dtype=torch.float64)
    return codes, scales, codes * scales[:, None]


@PROPERTY
@given(head_vectors, magnitudes)
def test_int8_per_token_head_error_at_most_half_a_step(values, magnitude):
    x = torch.from_numpy(values) * magnitude / 6e4
    codes, scales, x_hat = _round_trip("int8_per_token_head", x)
    expected_scale = torch.clamp(x.abs().amax(-1) / torch.tensor(127.0), min=formats.SCALE_EPS)
    assert torch.equal(scales.to(torch.float32), expected_scale)
    assert codes.abs().max() <= 127
    err = (x.to(torch.float64) - x_hat).abs()
    assert torch.all(err <= scales[:, None] / 2 * (1 + 1e-6))


@PROPERTY
@given(head_vectors, magnitudes)
def test_fp8_per_token_head_relative_bound(values, magnitude):
    x = torch.from_numpy(values) * magnitude / 6e4
    codes, scales, x_hat = _round_trip("fp8_per_token_head", x)
    expected_scale = torch.clamp(x.abs().amax(-1) / torch.tensor(448.0), min=formats.SCALE_EPS)
    assert torch.equal(scales.to(torch.float32), expected_scale)
    assert codes.abs().max() <= 448
    bound = x.abs().to(torch.float64) * 2.0 ** -4 + scales[:, None] * 2.0 ** -10
    assert torch.all((x.to(torch.float64) - x_hat).abs() <= bound * (1 + 1e-6))


@PROPERTY
@given(head_vectors, st.sampled_from([0.01, 0.37, 1.0, 8.0]))
def test_fp8_per_layer_bound_and_clamp(values, layer_scale):
    x = torch.from_numpy(values) / 100.0
    codes, _, x_hat = _round_trip("fp8", x, layer_scale)
    y = x.to(torch.float64) / layer_scale
    inside = y.abs() <= 448
    bound = x.abs().to(torch.float64) * 2.0 ** -4 + layer_scale * 2.0 ** -10
    assert torch.all(((x.to(torch.float64) - x_hat).abs() <= bound * (1 + 1e-6))[inside])
    assert torch.all(codes[~inside].abs() == 448)          # clamped, never NaN
    assert torch.isfinite(codes).all()

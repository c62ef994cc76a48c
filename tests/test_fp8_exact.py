"""The Triton e4m3 encoder is bit-identical to torch's float32 -> float8_e4m3fn cast."""
from __future__ import annotations

import torch

from minikv.kernels.quant import encode_e4m3, encode_e4m3_reference, torch_e4m3_saturates


def _all_finite_float16() -> torch.Tensor:
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    return every[torch.isfinite(every)].to(torch.float32)


def _assert_bits_equal(x: torch.Tensor):
    got, want = encode_e4m3(x), encode_e4m3_reference(x)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, (f"{bad.numel()} mismatches, e.g. x={x[bad[:5]].tolist()} "
                              f"triton={got[bad[:5]].tolist()} torch={want[bad[:5]].tolist()}")


def test_every_finite_float16_value():
    x = _all_finite_float16()
    assert x.numel() == 63488
    _assert_bits_equal(x)


def test_ties_denormals_signed_zero_and_saturation():
    # midpoints between neighbouring e4m3 values (ties go to the even code), both signs
    codes = torch.arange(0, 0x7E, dtype=torch.int32).to(torch.uint8)
    values = codes.view(torch.float8_e4m3fn).to(torch.float32)
    midpoints = (values[:-1] + values[1:]) / 2
    special = torch.tensor([0.0, -0.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -6, 448.0, 464.0, 464.5, 470.0,
                            479.9, 480.0, 1e6, float("inf"), -float("inf"), 1e-40, -1e-40, 3.4e38])
    x = torch.cat([midpoints, -midpoints, values, -values, special, -special])
    _assert_bits_equal(x)
    got = encode_e4m3(torch.tensor([0.0, -0.0]))
    assert got.tolist() == [0x00, 0x80]


def test_nan_encodes_as_nan():
    got = encode_e4m3(torch.tensor([float("nan")]))
    assert int(got.item()) & 0x7F == 0x7F


def test_random_float32_bit_patterns():
    gen = torch.Generator().manual_seed(7)
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 18,), dtype=torch.int64, generator=gen).to(torch.int32)
    x = bits.view(torch.float32)
    x = x[~torch.isnan(x)]
    _assert_bits_equal(x)


def test_overflow_mode_follows_this_torch():
    """torch >= 2.12 saturates finite overflow to 448; older versions give NaN. The encoder follows torch."""
    got = int(encode_e4m3(torch.tensor([470.0])).item())
    assert got == (0x7E if torch_e4m3_saturates("cpu") else 0x7F)


def test_non_saturating_mode_of_older_torch():
    """The mode older torch needs (overflow -> NaN 0x7F), checked on its defining values; same codes below 464."""
    from minikv.kernels.quant import _encode_e4m3_kernel
    x = torch.cat([_all_finite_float16(), torch.tensor([float("inf"), -float("inf"), 464.0, 464.5, 479.9])])
    out = torch.empty(x.shape, dtype=torch.uint8)
    _encode_e4m3_kernel[(1,)](x, out, x.numel(), BLOCK=1 << 17, SATURATE=False)
    saturating = encode_e4m3(x)
    small = x.abs() <= 464.0
    assert torch.equal(out[small], saturating[small])
    assert torch.all(out[~small] & 0x7F == 0x7F)
    assert torch.all((out[~small] & 0x80 != 0) == (x[~small] < 0))

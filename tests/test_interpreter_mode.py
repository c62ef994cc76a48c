"""kernels/mode.py's two interpreter shortcuts change the time a kernel takes on a CPU, never what it computes.

The overflow checks it drops are dead in the installed Triton: with them on, a kernel whose int32 add overflows
still runs to the end without an error, so dropping them loses no error a user could have seen. If a Triton release
made them live, the first test below fails and says so.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from minikv.kernels import mode

pytestmark = pytest.mark.skipif(not mode.INTERPRETED, reason="the shortcuts apply to the Triton interpreter only")

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _add_int32(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def _run_add(sanitize_overflow: bool) -> torch.Tensor:
    from triton.runtime import interpreter as interp
    builder = interp.interpreter_builder
    before = builder.options
    builder.options = dataclasses.replace(before, sanitize_overflow=sanitize_overflow)
    try:
        x = torch.tensor([2**31 - 1, 5, -7, 0], dtype=torch.int32)
        y = torch.tensor([1, 6, -8, 0], dtype=torch.int32)
        out = torch.empty_like(x)
        _add_int32[(1,)](x, y, out, N=4)
        return out
    finally:
        builder.options = before


def test_the_overflow_check_never_fails_so_dropping_it_loses_nothing():
    wrapped = [-(2**31), 11, -15, 0]                     # int32 wraps: what a compiled kernel gives too
    assert _run_add(sanitize_overflow=True).tolist() == wrapped    # the check ran, and raised nothing
    assert _run_add(sanitize_overflow=False).tolist() == wrapped


def test_the_interpreter_runs_without_the_overflow_check():
    from triton.runtime import interpreter as interp
    assert interp.interpreter_builder.options.sanitize_overflow is False
    assert getattr(interp, "_minikv_patched", False)

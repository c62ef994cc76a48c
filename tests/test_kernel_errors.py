"""Bad inputs are rejected with a clear ValueError/TypeError before any kernel is launched."""
from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import pytest
import torch

from conftest import cu_seqlens, make_pool, make_spec
from minikv.kernels import (KernelModeError, context_attention, context_attention_reference, formats,
                            paged_context_attention, paged_decode_attention, write_kv, write_kv_reference)
from minikv.kernels import cache_write, decode_attention as decode_module

# the package exports a function under the submodule's name, so fetch the module itself
context_module = importlib.import_module("minikv.kernels.context_attention")


class _NoLaunch:
    """Stands in for a Triton kernel: any launch fails the test."""

    def __getitem__(self, grid):
        raise AssertionError("a kernel was launched despite invalid input")


@pytest.fixture(autouse=True)
def no_kernel_launches(monkeypatch):
    for module, name in ((cache_write, "_write_kv_kernel"), (decode_module, "_decode_kernel"),
                         (decode_module, "_merge_splits_kernel"),
                         (context_module, "_context_kernel")):
        monkeypatch.setattr(module, name, _NoLaunch())


SPEC = make_spec("int8_per_token_head", torch.float16, 2, 16, 8)
FP8 = make_spec("fp8", torch.float16, 2, 16, 8)


def _spec_like(spec, **changes):
    fields = {f: getattr(spec, f) for f in formats.SPEC_FIELDS}
    fields.update(changes)
    return SimpleNamespace(**fields)


def _write_args(**changes):
    args = dict(key=torch.randn(3, 2, 16).half(), value=torch.randn(3, 2, 16).half(), pool=make_pool(SPEC, 2),
                slot_mapping=torch.tensor([0, 5, -1]), spec=SPEC)
    args.update(changes)
    return args


WRITE_ERRORS = {
    "unknown fmt": (dict(spec=_spec_like(SPEC, fmt=9)), ValueError, "unknown cache format"),
    "head size": (dict(spec=_spec_like(SPEC, head_size=48)), ValueError, "unsupported head size"),
    "missing field": (dict(spec=SimpleNamespace(fmt=4)), TypeError, "lacks the field"),
    "elem bytes": (dict(spec=_spec_like(SPEC, elem_bytes=2)), ValueError, "elem_bytes"),
    "key shape": (dict(key=torch.randn(3, 4, 16).half()), ValueError, "num_kv_heads"),
    "value dtype": (dict(value=torch.randn(3, 2, 16)), TypeError, "share a dtype"),
    "int dtype": (dict(key=torch.ones(3, 2, 16, dtype=torch.int32)), TypeError, "float16, bfloat16 or float32"),
    "slot dtype": (dict(slot_mapping=torch.tensor([0, 5, -1], dtype=torch.int32)), TypeError, "int64"),
    "slot count": (dict(slot_mapping=torch.tensor([0, 5])), ValueError, "entries for 3 tokens"),
    "slot beyond pool": (dict(slot_mapping=torch.tensor([0, 16, -1])), ValueError, "outside the pool"),
    "slot below -1": (dict(slot_mapping=torch.tensor([0, -2, 1])), ValueError, "outside the pool"),
    "pool dtype": (dict(pool=torch.zeros(2, SPEC.block_bytes, dtype=torch.int8)), TypeError, "uint8"),
    "pool strided": (dict(pool=torch.zeros(2, 2 * SPEC.block_bytes, dtype=torch.uint8)[:, ::2]), ValueError,
                     "contiguous"),
    "pool too small": (dict(pool=torch.zeros(SPEC.block_bytes - 4, dtype=torch.uint8)), ValueError, "no whole"),
    "pool not tensor": (dict(pool=bytearray(10)), TypeError, "torch.Tensor"),
    "bfloat16 on interpreter": (dict(key=torch.randn(3, 2, 16).bfloat16(), value=torch.randn(3, 2, 16).bfloat16()),
                                TypeError, "interpreter"),
    "two devices": (dict(slot_mapping=torch.tensor([0, 5, -1], device="meta")), ValueError, "one device"),
}


@pytest.mark.parametrize("case", list(WRITE_ERRORS))
@pytest.mark.parametrize("writer", [write_kv, write_kv_reference])
def test_write_rejects(case, writer):
    changes, error, message = WRITE_ERRORS[case]
    args = _write_args(**changes)
    before = args["pool"].clone() if isinstance(args["pool"], torch.Tensor) else None
    with pytest.raises(error, match=message):
        writer(**args)
    if before is not None:
        assert torch.equal(args["pool"], before)


def test_write_auto_cache_needs_matching_dtype():
    spec = make_spec("auto", torch.float16, 2, 16, 8)
    with pytest.raises(ValueError, match="as is"):
        write_kv(**_write_args(key=torch.randn(3, 2, 16), value=torch.randn(3, 2, 16), pool=make_pool(spec, 2),
                               spec=spec))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "1"])
def test_fp8_layer_scale_must_be_positive_finite(bad):
    with pytest.raises(ValueError, match="k_scale"):
        write_kv(**_write_args(pool=make_pool(FP8, 2), spec=FP8), k_scale=bad)


def test_wrong_mode_device_gives_mode_error():
    meta = dict(key=torch.randn(3, 2, 16, device="meta").half(), value=torch.randn(3, 2, 16, device="meta").half(),
                pool=torch.zeros(2, SPEC.block_bytes, dtype=torch.uint8, device="meta"),
                slot_mapping=torch.tensor([0, 5, -1], device="meta"))
    with pytest.raises(KernelModeError, match="interpreter"):
        write_kv(**_write_args(**meta))


def _decode_args(**changes):
    args = dict(q=torch.randn(2, 4, 16).half(), pool=make_pool(SPEC, 4),
                block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                seq_lens=torch.tensor([9, 16], dtype=torch.int32), spec=SPEC, sm_scale=0.25)
    args.update(changes)
    return args


DECODE_ERRORS = {
    "entry beyond pool": (dict(block_tables=torch.tensor([[0, 1], [2, 4]], dtype=torch.int32)), ValueError,
                          "outside the pool"),
    "negative entry": (dict(block_tables=torch.tensor([[0, -1], [2, 3]], dtype=torch.int32)), ValueError,
                       "outside the pool"),
    "seq beyond table": (dict(seq_lens=torch.tensor([9, 17], dtype=torch.int32)), ValueError, "exceed"),
    "empty seq": (dict(seq_lens=torch.tensor([0, 16], dtype=torch.int32)), ValueError, "at least 1"),
    "heads": (dict(q=torch.randn(2, 3, 16).half()), ValueError, "multiple"),
    "head size": (dict(q=torch.randn(2, 4, 32).half()), ValueError, "head size"),
    "batch": (dict(q=torch.randn(3, 4, 16).half()), ValueError, "sequences"),
    "table dtype": (dict(block_tables=torch.tensor([[0, 1], [2, 3]])), TypeError, "int32"),
    "lens dtype": (dict(seq_lens=torch.tensor([9, 16])), TypeError, "int32"),
    "q rank": (dict(q=torch.randn(2, 64).half()), ValueError, "dimensions"),
    "out shape": (dict(out=torch.empty(2, 4, 8).half()), ValueError, "out must be"),
    "unknown fmt": (dict(spec=_spec_like(SPEC, fmt=-1)), ValueError, "unknown cache format"),
}


@pytest.mark.parametrize("case", list(DECODE_ERRORS))
def test_decode_rejects(case):
    changes, error, message = DECODE_ERRORS[case]
    with pytest.raises(error, match=message):
        paged_decode_attention(**_decode_args(**changes))


def test_decode_fp8_needs_valid_scales():
    with pytest.raises(ValueError, match="v_scale"):
        paged_decode_attention(**_decode_args(pool=make_pool(FP8, 4), spec=FP8), v_scale=0.0)


def _context_args(**changes):
    args = dict(q=torch.randn(7, 4, 16), k=torch.randn(9, 2, 16), v=torch.randn(9, 2, 16),
                cu_seqlens_q=cu_seqlens([3, 4]), cu_seqlens_k=cu_seqlens([4, 5]), causal=True, sm_scale=0.25)
    args.update(changes)
    return args


CONTEXT_ERRORS = {
    "cu not from 0": (dict(cu_seqlens_q=torch.tensor([1, 3, 7], dtype=torch.int32)), ValueError, "start at 0"),
    "cu decreasing": (dict(cu_seqlens_k=torch.tensor([0, 6, 5, 9], dtype=torch.int32),
                           cu_seqlens_q=cu_seqlens([3, 0, 4])), ValueError, "never decrease"),
    "cu total": (dict(cu_seqlens_q=cu_seqlens([3, 3])), ValueError, "token count 7"),
    "cu count": (dict(cu_seqlens_k=cu_seqlens([4, 4, 1])), ValueError, "same number"),
    "causal short kv": (dict(cu_seqlens_k=cu_seqlens([2, 7])), ValueError, "at least as many keys"),
    "kv dtype": (dict(k=torch.randn(9, 2, 16).half(), v=torch.randn(9, 2, 16).half()), TypeError, "share a dtype"),
    "kv shapes": (dict(v=torch.randn(9, 1, 16)), ValueError, "one shape"),
    "heads": (dict(k=torch.randn(9, 3, 16), v=torch.randn(9, 3, 16)), ValueError, "multiple"),
    "head size": (dict(q=torch.randn(7, 4, 24), k=torch.randn(9, 2, 24), v=torch.randn(9, 2, 24)), ValueError,
                  "unsupported head size"),
    "cu dtype": (dict(cu_seqlens_q=cu_seqlens([3, 4]).long()), TypeError, "int32"),
}


@pytest.mark.parametrize("case", list(CONTEXT_ERRORS))
@pytest.mark.parametrize("fn", [context_attention, context_attention_reference])
def test_context_rejects(case, fn):
    changes, error, message = CONTEXT_ERRORS[case]
    with pytest.raises(error, match=message):
        fn(**_context_args(**changes))


def _paged_args(**changes):
    args = dict(q=torch.randn(7, 4, 16).half(), pool=make_pool(SPEC, 4),
                block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), cu_seqlens_q=cu_seqlens([3, 4]),
                seq_lens=torch.tensor([9, 16], dtype=torch.int32), spec=SPEC, causal=True, sm_scale=0.25)
    args.update(changes)
    return args


PAGED_ERRORS = {
    "entry beyond pool": (dict(block_tables=torch.tensor([[0, 9], [2, 3]], dtype=torch.int32)), ValueError,
                          "outside the pool"),
    "seq beyond table": (dict(seq_lens=torch.tensor([17, 16], dtype=torch.int32)), ValueError, "exceed"),
    "causal short kv": (dict(seq_lens=torch.tensor([2, 16], dtype=torch.int32)), ValueError, "at least as many"),
    "cu count": (dict(cu_seqlens_q=cu_seqlens([7])), ValueError, "entries"),
    "head size": (dict(q=torch.randn(7, 4, 32).half()), ValueError, "head size"),
    "spec head size": (dict(spec=_spec_like(SPEC, head_size=20)), ValueError, "unsupported head size"),
    "pool dtype": (dict(pool=torch.zeros(4, SPEC.block_bytes, dtype=torch.float32)), TypeError, "uint8"),
    "misaligned pool": (dict(pool=torch.zeros(4 * SPEC.block_bytes + 1, dtype=torch.uint8)[1:]), ValueError,
                        "aligned"),
}


@pytest.mark.parametrize("case", list(PAGED_ERRORS))
def test_paged_context_rejects(case):
    changes, error, message = PAGED_ERRORS[case]
    with pytest.raises(error, match=message):
        paged_context_attention(**_paged_args(**changes))


def test_valid_inputs_reach_the_launch():
    """The guards above are not simply rejecting everything: valid input gets as far as the kernel launch."""
    with pytest.raises(AssertionError, match="launched"):
        write_kv(**_write_args())
    with pytest.raises(AssertionError, match="launched"):
        paged_decode_attention(**_decode_args())
    with pytest.raises(AssertionError, match="launched"):
        context_attention(**_context_args())
    with pytest.raises(AssertionError, match="launched"):
        paged_context_attention(**_paged_args(spec=dataclasses.replace(SPEC)))

"""The attention backend protocol and the adapters for kernels that are not minikv's (minikv.attention.backends).

Kernel level: each CPU adapter's write stores the reference writer's bytes, and its decode and paged context agree
with minikv's references on every format, both placements, GQA and a sliding window. Engine level: an adapter,
given by name or as an instance, runs inside minikv's models (KV-sharing layers in tiny-gemma4, cross pools and
the relative bias in tiny-t5) and gives the torch backend's tokens. A missing package is a one-line error naming
it. FlashInfer's tests need CUDA and flashinfer-python (marked gpu); no shipped model has a head size FlashInfer
takes (64, 128, 256 for every layer), so FlashInfer is tested at kernel level only.
"""
from __future__ import annotations

import importlib
import sys

import pytest
import torch
from minikv.kernels.addressing import sequence_slots
from minikv.kernels.errors import InvalidTypeError

import minikv
from minikv import kernels
from minikv.attention import backends
from minikv.attention.backend import get_ops
from minikv.attention.protocol import AttentionBackend, PagedPool
from minikv.cache.layout import KVLayout

CPU_ADAPTERS = ("sdpa", "flexattention")
FORMATS = [("auto", torch.float32, "row"), ("auto", torch.float16, "row"), ("fp8", torch.float16, "row"),
           ("int8_per_token_head", torch.float32, "row"), ("fp8_per_token_head", torch.float16, "block"),
           ("int8_per_token_head", torch.float16, "block")]


def _filled(layout: KVLayout, k_scale: float, v_scale: float):
    """A pool of 10 blocks holding two requests (13 and 16 tokens, permuted blocks) written by the reference."""
    pool = torch.randint(0, 256, (10 * layout.block_bytes,), dtype=torch.uint8)
    tables = torch.tensor([[3, 7, 0], [9, 1, 0]], dtype=torch.int32)
    lens = torch.tensor([13, 16], dtype=torch.int32)
    slots = torch.cat([sequence_slots(tables[b], int(lens[b]), layout.block_size) for b in range(2)])
    shape = (slots.numel(), layout.num_kv_heads, layout.head_size)
    key, value = torch.randn(shape).to(layout.model_dtype), torch.randn(shape).to(layout.model_dtype)
    return pool, tables, lens, slots, key, value


@pytest.mark.parametrize("name", CPU_ADAPTERS)
@pytest.mark.parametrize("fmt,dtype,placement", FORMATS)
def test_adapter_matches_minikv_references(name, fmt, dtype, placement):
    layout = KVLayout(fmt, dtype, 2, 64, 8, placement)
    k_scale, v_scale = (0.5, 2.0) if fmt == "fp8" else (1.0, 1.0)
    pool, tables, lens, slots, key, value = _filled(layout, k_scale, v_scale)
    backend = backends.get(name)
    mine = pool.clone()
    backend.write_kv(key, value, mine, slots, layout.spec, k_scale, v_scale)
    kernels.write_kv_reference(key, value, pool, slots, layout.spec, k_scale, v_scale)
    assert torch.equal(mine, pool)                      # the torch writer stores the reference's bytes
    q = torch.randn(2, 4, 64).to(dtype)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    for window in (0, 5):
        want = kernels.paged_decode_attention_reference(q, pool, tables, lens, layout.spec, 0.125, k_scale,
                                                        v_scale, sliding_window=window)
        got = backend.decode(q, pool, tables, lens, layout.spec, 0.125, k_scale, v_scale, sliding_window=window)
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    qc = torch.randn(7, 4, 64).to(dtype)
    for causal, window in ((True, 0), (True, 4), (False, 0)):
        want = kernels.paged_context_attention_reference(qc, pool, tables, cu, lens, layout.spec, causal, 0.125,
                                                         k_scale, v_scale, sliding_window=window)
        got = backend.paged_context(qc, pool, tables, cu, lens, layout.spec, causal, 0.125, k_scale, v_scale,
                                    sliding_window=window)
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_paged_pool_views_address_the_pool_bytes():
    """PagedPool's page and scale views are the bytes minikv's layout puts there (block placement: scales apart)."""
    layout = KVLayout("int8_per_token_head", torch.float32, 2, 64, 8, "block")
    pool = torch.zeros(3 * layout.block_bytes, dtype=torch.uint8)
    key, value = torch.randn(1, 2, 64), torch.randn(1, 2, 64)
    kernels.write_kv_reference(key, value, pool, torch.tensor([13]), layout.spec)
    p = PagedPool.of(pool, layout.spec)
    k_view, v_view = layout.code_views(pool)
    k_scales, v_scales = layout.scale_views(pool)
    assert torch.equal(p.k_pages, k_view) and torch.equal(p.v_pages, v_view)
    assert torch.equal(p.k_page_scales, k_scales) and torch.equal(p.v_page_scales, v_scales)
    back = p.pages(1, torch.tensor([1]), torch.float32)[0, 5]
    torch.testing.assert_close(back, value[0], atol=float(v_scales[1, 5].max()), rtol=0)


def test_minikv_backends_and_adapters_are_attention_backends():
    for backend in (get_ops("torch"), get_ops("triton"), *(backends.get(n) for n in CPU_ADAPTERS)):
        assert isinstance(backend, AttentionBackend), backend
    assert not isinstance(object(), AttentionBackend)


def test_engine_refuses_an_object_that_is_not_a_backend():
    with pytest.raises(InvalidTypeError, match="AttentionBackend"):
        minikv.LLM(model="tiny-gemma4", backend=object())


@pytest.mark.parametrize("model,fmt", [("tiny-gemma4", "int8_per_token_head"), ("tiny-t5", "fp8")])
def test_adapters_run_inside_minikvs_models(model, fmt):
    """KV-sharing layers (tiny-gemma4) and cross pools with T5's relative bias (tiny-t5): the adapters' tokens are
    the torch backend's."""
    outs = {}
    for backend in ("torch", "sdpa", backends.get("flexattention")):
        llm = minikv.LLM(model=model, kv_cache_dtype=fmt, backend=backend, max_num_seqs=2, block_size=8)
        prompts = llm.task.prompts(2, seed=1)
        done = llm.generate(prompts, minikv.SamplingParams(max_tokens=5), use_tqdm=False)
        outs[getattr(backend, "name", backend)] = [o.token_ids for o in done]
    assert outs["sdpa"] == outs["torch"] and outs["flexattention"] == outs["torch"]


def test_an_adapter_refuses_what_its_features_lack():
    """A window or a relative bias the backend cannot apply is refused inside the engine, not ignored."""
    import dataclasses
    narrow = backends.get("sdpa")
    narrow.features = dataclasses.replace(narrow.features, sliding_window=False,
                                          notes={"sliding_window": "this kernel has no window"})
    llm = minikv.LLM(model="tiny-gemma4", backend=narrow, max_num_seqs=1)
    with pytest.raises(NotImplementedError, match="sdpa: this kernel has no window"):
        llm.generate(llm.task.prompts(1, seed=0), minikv.SamplingParams(max_tokens=2), use_tqdm=False)


def test_a_missing_package_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)
    monkeypatch.delitem(sys.modules, "minikv.attention.backends.flex", raising=False)
    with pytest.raises(backends.MissingBackendError) as info:
        backends.get("flexattention")
    assert "\n" not in str(info.value) and "torch>=2.5" in str(info.value)
    monkeypatch.undo()
    importlib.import_module("minikv.attention.backends.flex")
    if importlib.util.find_spec("flashinfer") is None:
        with pytest.raises(backends.MissingBackendError, match="pip install flashinfer-python"):
            backends.get("flashinfer")
    with pytest.raises(KeyError, match="flexattention, sdpa, flashinfer"):
        backends.get("nope")


def _flashinfer():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    try:
        return backends.get("flashinfer")
    except backends.MissingBackendError as e:
        pytest.skip(str(e))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,dtype", [("auto", torch.bfloat16), ("auto", torch.float16), ("fp8", torch.bfloat16)])
def test_flashinfer_matches_minikv_references_on_cuda(fmt, dtype):
    backend = _flashinfer()
    layout = KVLayout(fmt, dtype, 2, 128, 16)
    k_scale, v_scale = (0.5, 2.0) if fmt == "fp8" else (1.0, 1.0)
    pool, tables, lens, slots, key, value = (t.cuda() for t in _filled(layout, k_scale, v_scale))
    kernels.write_kv_reference(key, value, pool, slots, layout.spec, k_scale, v_scale)
    q = torch.randn(2, 8, 128, device="cuda").to(dtype)
    for window in (0, 5):
        want = kernels.paged_decode_attention_reference(q, pool, tables, lens, layout.spec, 128 ** -0.5, k_scale,
                                                        v_scale, sliding_window=window)
        got = backend.decode(q, pool, tables, lens, layout.spec, 128 ** -0.5, k_scale, v_scale, sliding_window=window)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device="cuda")
    qc = torch.randn(7, 8, 128, device="cuda").to(dtype)
    for causal, window in ((True, 0), (True, 4), (False, 0)):
        want = kernels.paged_context_attention_reference(qc, pool, tables, cu, lens, layout.spec, causal,
                                                         128 ** -0.5, k_scale, v_scale, sliding_window=window)
        got = backend.paged_context(qc, pool, tables, cu, lens, layout.spec, causal, 128 ** -0.5, k_scale, v_scale,
                                    sliding_window=window)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)

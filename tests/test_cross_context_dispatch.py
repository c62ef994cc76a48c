"""The cross context step's dispatch by shape: minikv's fused configuration takes the fused
kernel for short queries and the unfused one for long ones, the trace says why, both paths give the same output,
and upstream's fallback and the historical B2 path decide as before. CrossAttentionImpl is driven directly on
small shapes with the torch backend (the kernels are not the point)."""
from __future__ import annotations

from itertools import accumulate

import pytest
import torch

import minikv
from minikv.attention import cross
from minikv.attention.backend import get_ops
from minikv.attention.cross import FUSED_CROSS_MAX_QUERY_LEN, CrossAttentionImpl, context_path_for
from minikv.attention.metadata import AttentionMetadata, CrossMetadata
from minikv.cache.layout import KVLayout

HQ, HKV, D, BS = 4, 2, 32, 16
LONG = FUSED_CROSS_MAX_QUERY_LEN + 1


def context_step(q_lens, enc_lens=(19, 33), kv_cache_dtype="fp8", dtype=torch.float16, seed=0):
    """(layout, q, k, v, pool, md) of one cross context step: each sequence's encoder K/V in its own blocks."""
    g = torch.Generator().manual_seed(seed)
    layout = KVLayout(kv_cache_dtype, dtype, HKV, D, BS)
    tables, slots, first = [], [], 0
    for n in enc_lens:
        blocks = list(range(first, first + -(-n // BS)))
        first += len(blocks)
        tables.append(blocks + [0] * (3 - len(blocks)))
        slots += [blocks[i // BS] * BS + i % BS for i in range(n)]
    q = torch.randn(sum(q_lens), HQ, D, generator=g).to(dtype)
    k = torch.randn(sum(enc_lens), HKV, D, generator=g).to(dtype)
    v = torch.randn(sum(enc_lens), HKV, D, generator=g).to(dtype)
    pool = torch.zeros(first + 2, layout.block_bytes, dtype=torch.uint8)     # room for the historical read
    i32 = (lambda x: torch.tensor(list(x), dtype=torch.int32))
    cm = CrossMetadata(encoder_seq_lens=i32(enc_lens), block_tables=i32(tables),
                       encoder_start_loc=i32(accumulate(enc_lens, initial=0)), slot_mapping=torch.tensor(slots))
    md = AttentionMetadata(is_prefill=True, slot_mapping=torch.full((sum(q_lens),), -1),
                           query_start_loc=i32(accumulate(q_lens, initial=0)),
                           seq_lens=i32(q_lens), block_tables=i32([[0]] * len(q_lens)),
                           max_query_len=max(q_lens), max_seq_len=max(q_lens), cross=cm)
    return layout, q, k, v, pool, md


def impl(layout, **kw):
    return CrossAttentionImpl("cross.0", HQ, layout, get_ops("torch"), sm_scale=1.0, **kw)


def test_the_rule_is_the_constant():
    assert context_path_for(1) == context_path_for(FUSED_CROSS_MAX_QUERY_LEN) == "fused"
    assert context_path_for(LONG) == "unfused"


@pytest.mark.parametrize("q_lens, path, why", [
    ((1, 1), "fused", f"by shape (q_len 1 <= {FUSED_CROSS_MAX_QUERY_LEN})"),
    ((3, FUSED_CROSS_MAX_QUERY_LEN), "fused",
     f"by shape (q_len {FUSED_CROSS_MAX_QUERY_LEN} <= {FUSED_CROSS_MAX_QUERY_LEN})"),
    ((1, LONG), "unfused", f"by shape (q_len {LONG} > {FUSED_CROSS_MAX_QUERY_LEN})"),   # the longest query decides
])
def test_fused_configuration_dispatches_by_the_longest_query(q_lens, path, why):
    layout, q, k, v, pool, md = context_step(q_lens)
    _, access = impl(layout).forward(q, k, v, pool, md, step=0)
    assert (access.context_path, access.context_dispatch) == (path, why)
    assert access.wrote and access.read == (path == "fused")     # the unfused path reads the workspace, not the pool


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_both_paths_give_the_same_output(monkeypatch, kv_cache_dtype):
    """The same step through each path (the constant moved to either side of its q_len): they read the same K/V,
    the fused path as the cache holds them, so the unfused path is fed the cache's rounding of them."""
    layout, q, k, v, pool, md = context_step((5, 2), kv_cache_dtype=kv_cache_dtype)
    outs = {}
    for limit, path in ((5, "fused"), (4, "unfused")):
        monkeypatch.setattr(cross, "FUSED_CROSS_MAX_QUERY_LEN", limit)
        kk, vv = (k, v) if path == "fused" or kv_cache_dtype == "auto" else \
            (t.to(torch.float8_e4m3fn).to(t.dtype) for t in (k, v))
        outs[path], access = impl(layout).forward(q, kk, vv, pool, md, step=0)
        assert access.context_path == path
    torch.testing.assert_close(outs["fused"].float(), outs["unfused"].float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("kw, kv_cache_dtype, dtype, path, why", [
    ({"context_path": "fallback"}, "fp8", torch.float16, "unfused",
     'by config ("fallback", fp8 cache, paged context off)'),
    ({"context_path": "fallback"}, "auto", torch.float16, "fused", 'by config ("fallback", 16-bit cache)'),
    ({"context_path": "fallback", "paged_context": True}, "fp8", torch.float16, "fused",
     'by config ("fallback", paged context on)'),
    ({"context_path": "fallback"}, "fp8", torch.float32, "unfused", "by config (float32 model)"),
    ({"historical_context_read": True}, "fp8", torch.float16, "fused", "by config (historical B2 read)"),
])
@pytest.mark.parametrize("q_len", [1, LONG])
def test_fallback_and_historical_paths_do_not_look_at_the_shape(kw, kv_cache_dtype, dtype, path, why, q_len):
    layout, q, k, v, pool, md = context_step((q_len, 1), kv_cache_dtype=kv_cache_dtype, dtype=dtype)
    layer = impl(layout, **kw)
    _, access = layer.forward(q, k, v, pool, md, step=0)
    assert (access.context_path, access.context_dispatch) == (path, why)
    if kw.get("historical_context_read"):
        assert access.read_layout.elem_bytes == 2          # still told the pool holds 16-bit elements (defect B2)


@pytest.mark.parametrize("repro, why", [
    (minikv.ReproConfig(), f"by shape (q_len 1 <= {FUSED_CROSS_MAX_QUERY_LEN})"),
    (minikv.ReproConfig(cross_context_path="fallback"), 'by config ("fallback", fp8 cache, paged context off)'),
])
def test_the_step_trace_says_why(repro, why):
    """Through the engine: T5's decoder starts from one token, so its context step is short and stays fused."""
    llm = minikv.LLM(model="tiny-t5", kv_cache_dtype="fp8", dtype=torch.float16, backend="torch", max_num_seqs=2,
                     repro=repro)
    for p in ("abc1", "zyx9"):
        llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=2))
    first = llm.step()
    cross_events = [e for e in first.trace.events if e.kind == "cross"]
    assert cross_events and all(e.context_dispatch == why for e in cross_events)
    assert f"context_dispatch={why!r}" in repr(cross_events[0])
    assert all(e.context_dispatch is None for e in llm.step().trace.events)      # decode: no context step

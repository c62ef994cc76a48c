"""`minikv.bench attention --peer flashinfer` without FlashInfer or a GPU: FlashInfer's NHD view of minikv's pool
puts every written K/V element where FlashInfer looks for it, the peer targets are computed from the right rows,
and a missing FlashInfer gives a clear error (FlashInfer itself is timed only on a GPU: tools/gpu.sh bench)."""
from __future__ import annotations

import sys

import pytest
import torch

from minikv.bench import attention
from minikv.bench.flashinfer_peer import FlashInferUnavailable, load, paged_view
from minikv.cache.layout import KVLayout
from minikv.kernels.cache_write import write_kv_reference


@pytest.mark.parametrize("fmt", ["auto", "fp8"])
@pytest.mark.parametrize("heads, head_size, block_size", [(8, 128, 16), (2, 64, 8)])
def test_nhd_view_holds_every_written_element(fmt, heads, head_size, block_size):
    torch.manual_seed(0)
    layout = KVLayout(fmt, torch.bfloat16, heads, head_size, block_size)
    num_blocks = 5
    pool = torch.zeros(num_blocks, layout.block_bytes, dtype=torch.uint8)
    slots = torch.randperm(num_blocks * block_size)[:17]
    k = torch.randn(len(slots), heads, head_size, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    write_kv_reference(k, v, pool, slots, layout, validate=False)   # (validation refuses bf16 on CPU)
    kv = paged_view(pool, fmt, block_size, heads, head_size)      # [pages, 2, page size, heads, head size]
    assert kv.shape == (num_blocks, 2, block_size, heads, head_size)
    page, slot = slots // block_size, slots % block_size
    dtype = kv.dtype
    assert torch.equal(kv[page, 0, slot].float(), k.to(dtype).float())
    assert torch.equal(kv[page, 1, slot].float(), v.to(dtype).float())


def test_formats_without_a_counterpart_are_refused():
    layout = KVLayout("int8_per_token_head", torch.bfloat16, 8, 128, 16)
    pool = torch.zeros(2, layout.block_bytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match="no counterpart"):
        paged_view(pool, "int8_per_token_head", 16, 8, 128)


def _decode(fmt, batch, context, ms, fi_ms=None):
    row = {"kind": "decode", "format": fmt, "batch": batch, "context": context, "ms": ms, "sdpa_over_minikv": 1.0}
    if fi_ms is not None:
        row.update(flashinfer_ms=fi_ms, flashinfer_over_minikv=fi_ms / ms, flashinfer_variant="tensor cores")
    return row


def test_peer_targets_take_the_worst_shape_with_batch_16_or_more():
    rows = [_decode("auto", 1, 4096, 1.0, 0.5),           # batch 1: not part of the target
            _decode("auto", 16, 4096, 1.0, 0.9),          # the worst bf16 shape
            _decode("auto", 64, 4096, 1.0, 1.2),
            _decode("fp8", 16, 4096, 0.5, 0.6),           # 1.2x
            _decode("fp8", 64, 4096, 0.5, 0.525),         # the worst fp8 shape: 1.05x
            _decode("int8_per_token_head", 64, 4096, 0.6)]  # no peer figure
    got = {w: (round(v, 3), g) for w, v, g in attention.targets(rows) if "FlashInfer" in w}
    assert got == {"bf16 paged decode vs FlashInfer's, worst with batch >= 16 (batch 16, context 4096; FlashInfer "
                   "tensor cores)": (0.9, 1.0),
                   "fp8 paged decode vs FlashInfer's, worst with batch >= 16 (batch 64, context 4096; FlashInfer "
                   "tensor cores)": (1.05, 1.1)}


def test_peer_targets_read_back_from_csv(tmp_path):
    rows = [_decode("auto", 64, 4096, 0.25, 0.26), _decode("fp8", 64, 4096, 0.18, 0.2)]
    path = tmp_path / "attention.csv"
    attention.write_csv(rows, path)
    import csv
    with open(path) as f:
        back = [dict(r, batch=int(r["batch"]), context=int(r["context"])) for r in csv.DictReader(f)]
    assert [round(v, 6) for w, v, _ in attention.targets(back) if "FlashInfer" in w] == \
        [round(v, 6) for w, v, _ in attention.targets(rows) if "FlashInfer" in w]


def test_missing_flashinfer_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)            # import flashinfer -> ImportError
    with pytest.raises(FlashInferUnavailable, match="pack_flashinfer.sh"):
        load()

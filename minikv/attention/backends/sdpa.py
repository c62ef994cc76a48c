"""torch's scaled_dot_product_attention over the pages gathered for each request, one request at a time.

Every format is read by dequantizing the request's pages (PagedPool.pages) into the query's dtype; masks
(causal, sliding window) and T5's relative bias go in as SDPA's float attention mask.
"""
from __future__ import annotations

import torch

from minikv.attention.protocol import Adapter, ContextStep, DecodeStep, Features
from minikv.attention.protocol import sdpa_attend as attend

if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 5):     # SDPA's enable_gqa came in 2.5
    from . import MissingBackendError
    raise MissingBackendError("the sdpa backend needs torch>=2.5 (pip install 'minikv[sdpa]')")


def gather(pool, kv: int, table_row, length: int, dtype) -> torch.Tensor:
    """[length, Hkv, D]: a request's first `length` tokens of K (kv=0) or V, dequantized into `dtype`."""
    blocks = table_row[: -(-length // pool.block_size)].to(torch.int64)
    pages = pool.pages(kv, blocks, dtype)
    return pages.reshape(-1, *pages.shape[2:])[:length]


class Backend(Adapter):
    name = "sdpa"
    features = Features()

    def decode_step(self, s: DecodeStep) -> torch.Tensor:
        out = torch.empty_like(s.q)
        for b, length in enumerate(s.seq_lens.tolist()):
            k, v = (gather(s.pool, kv, s.block_tables[b], length, s.q.dtype) for kv in (0, 1))
            out[b] = attend(s.q[b:b + 1], k, v, True, s.sm_scale, s.sliding_window, s.rel_bias)[0]
        return out

    def context_step(self, s: ContextStep) -> torch.Tensor:
        out = torch.empty_like(s.q)
        cq = s.cu_seqlens_q.tolist()
        for b, length in enumerate(s.seq_lens.tolist()):
            if cq[b + 1] == cq[b]:
                continue
            k, v = (gather(s.pool, kv, s.block_tables[b], length, s.q.dtype) for kv in (0, 1))
            out[cq[b]:cq[b + 1]] = attend(s.q[cq[b]:cq[b + 1]], k, v, s.causal, s.sm_scale, s.sliding_window,
                                          s.rel_bias)
        return out

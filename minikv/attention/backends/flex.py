"""torch's FlexAttention over paged block tables: one call per step, every request's pages at once.

The pages the block tables name are dequantized once into a compact K/V [1, Hkv, pages x block_size, D]. A
per-request map from compact to logical page lets the score_mod place each key in its request: keys outside it,
past its length, after the query or outside the window score -inf; T5's relative bias is added there too. Runs
eagerly on CPU (FlexAttention then computes the scores densely) and on CUDA.
"""
from __future__ import annotations

import warnings

import torch

from minikv.attention.protocol import Adapter, ContextStep, DecodeStep, Features

try:
    from torch.nn.attention.flex_attention import flex_attention
except ImportError as e:
    from . import MissingBackendError
    raise MissingBackendError("the flexattention backend needs torch>=2.5 (pip install 'minikv[flexattention]')") \
        from e


def paged_flex(q, q_lens, pool, block_tables, seq_lens, causal: bool, sm_scale: float, window: int, rel_bias):
    """q [B, Hq, L, D] (request b's first q_lens[b] rows are real) over each request's pages: [B, Hq, L, D]."""
    bs, batch = pool.block_size, q.shape[0]
    lens = seq_lens.to(torch.int64)
    used = -(-lens // bs)                                                  # pages per request
    cols = torch.arange(block_tables.shape[1], device=q.device)[None, :]
    named = cols < used[:, None]
    blocks, compact = torch.unique(block_tables.to(torch.int64)[named], return_inverse=True)
    logical = torch.full((batch, blocks.numel()), -1, dtype=torch.int64, device=q.device)
    rows = torch.arange(batch, device=q.device)[:, None].expand_as(named)[named]
    logical[rows, compact] = cols.expand_as(named)[named]
    # slots no request holds (the unwritten tail of a last page) may hold any bytes, NaN included: zero them, as
    # a probability of 0 times NaN would still be NaN
    places = torch.arange(bs, device=q.device)
    filled = ((logical[:, :, None] >= 0) & (logical[:, :, None] * bs + places < lens[:, None, None])).any(0)
    k, v = (torch.where(filled[..., None, None], pool.pages(kv, blocks, q.dtype), 0)
            .reshape(1, -1, *pool.k_pages.shape[2:]).transpose(1, 2) for kv in (0, 1))
    first_q = lens - q_lens.to(torch.int64)                                # position of each request's row 0
    max_distance = 0 if rel_bias is None else rel_bias.shape[1] - 1

    def score_mod(score, b, h, qi, kv):
        page = logical[b, kv // bs]
        pos = page * bs + kv % bs
        qpos = first_q[b] + qi
        ok = (page >= 0) & (pos < lens[b])
        if causal:
            ok = ok & (pos <= qpos)
            if window:
                ok = ok & (pos > qpos - window)
        if rel_bias is not None:
            score = score + rel_bias[h, (qpos - pos).clamp(0, max_distance)].to(score.dtype)
        return torch.where(ok, score, -float("inf"))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # eager FlexAttention warns that it is not compiled
        return flex_attention(q, k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), score_mod=score_mod,
                              scale=sm_scale, enable_gqa=q.shape[1] != k.shape[1])


class Backend(Adapter):
    name = "flexattention"
    features = Features()

    def decode_step(self, s: DecodeStep) -> torch.Tensor:
        ones = torch.ones_like(s.seq_lens)
        out = paged_flex(s.q[:, :, None], ones, s.pool, s.block_tables, s.seq_lens, True, s.sm_scale,
                         s.sliding_window, s.rel_bias)
        return out[:, :, 0]

    def context_step(self, s: ContextStep) -> torch.Tensor:
        cq = s.cu_seqlens_q.to(torch.int64)
        q_lens = cq[1:] - cq[:-1]
        batch, longest = q_lens.numel(), int(q_lens.max()) if q_lens.numel() else 0
        if s.q.shape[0] == 0:
            return torch.empty_like(s.q)
        row = torch.arange(longest, device=s.q.device)[None, :]
        real = row < q_lens[:, None]
        index = (cq[:-1, None] + row)[real]
        padded = s.q.new_zeros(batch, longest, *s.q.shape[1:])
        padded[real] = s.q[index]
        out = paged_flex(padded.transpose(1, 2), q_lens, s.pool, s.block_tables, s.seq_lens, s.causal,
                         s.sm_scale, s.sliding_window, s.rel_bias)
        result = torch.empty_like(s.q)
        result[index] = out.transpose(1, 2)[real]
        return result

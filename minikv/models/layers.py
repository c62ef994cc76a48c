"""The attention op shared by the Gemma-4 and T5 models, and the check of their token inputs.

The attention op (`Attention`) is the seam between a model and the engine. With no forward context (training,
and the dense golden reference) it computes plain attention on batched tensors [B, T, heads, D]. Under the
engine's forward context it hands flattened tensors [T, heads, D] to the AttentionImpl the runner bound to it,
together with the KV cache tensor the runner bound to it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minikv.attention.context import get_forward_context


def check_token_inputs(input_ids: torch.Tensor, positions: torch.Tensor) -> bool:
    """Validate a model's token inputs for its mode; return True in engine mode (flattened [T]), False in dense
    mode ([B, T])."""
    engine = get_forward_context() is not None
    if input_ids.dim() != (1 if engine else 2) or positions.shape != input_ids.shape:
        mode = "engine mode takes flattened [T]" if engine else "dense mode takes [B, T]"
        raise ValueError(f"{mode} input_ids and positions of the same shape; got input_ids "
                         f"{tuple(input_ids.shape)} and positions {tuple(positions.shape)}")
    return engine


def dense_attention(q, k, v, causal: bool, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plain attention. q: [B, T, Hq, D]; k, v: [B, S, Hkv, D]; key_mask: bool [B, S], True = attend."""
    hq, hkv = q.shape[-2], k.shape[-2]
    if hq != hkv:                                   # GQA / MQA: repeat each KV head for its query group
        k = k.repeat_interleave(hq // hkv, dim=-2)
        v = v.repeat_interleave(hq // hkv, dim=-2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
    mask = None
    if key_mask is not None:
        mask = key_mask[:, None, None, :]
        if causal:
            t, s = q.shape[-2], k.shape[-2]
            mask = mask & torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
        causal = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return out.transpose(1, 2)


class Attention(nn.Module):
    """The attention op of one layer (projections live in the model).

    kind: "self" (causal, paged) or "cross" (non-causal over encoder K/V held in the cross pool).
    kv_sharing_target: for a KV-sharing layer, the name of the earlier layer whose cache it reads; such a layer
    has no K/V projections and never writes the cache.
    sliding_window: keys a query sees, its own included (None or 0: all earlier ones); self attention only.
    sm_scale: the factor on q.k (None: head_size ** -0.5; Gemma-4 and T5 use 1.0).
    rel_bias: T5's relative position bias for the paged kernels, float32 [num_heads, max_distance + 1] (added to
    the scaled score of key j as rel_bias[h, min(q_pos - j, max_distance)]); self attention only, engine only
    (dense mode adds its own bias). None: no bias.
    """

    def __init__(self, layer_name: str, num_heads: int, num_kv_heads: int, head_size: int,
                 kind: str = "self", kv_sharing_target: str | None = None, *, sliding_window: int | None = None,
                 sm_scale: float | None = None, rel_bias: torch.Tensor | None = None):
        super().__init__()
        if kind not in ("self", "cross"):
            raise ValueError(f"kind must be 'self' or 'cross', got {kind!r}")
        self.layer_name = layer_name
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.kind = kind
        self.kv_sharing_target = kv_sharing_target
        if sliding_window and kind != "self":
            raise ValueError(f"{layer_name}: a sliding window applies to self attention only")
        self.sliding_window = int(sliding_window or 0)
        self.sm_scale = sm_scale
        if rel_bias is not None and kind != "self":
            raise ValueError(f"{layer_name}: a relative position bias applies to self attention only")
        self.rel_bias = rel_bias
        self.impl = None        # set by the model runner
        self.kv_cache = None    # set by the model runner (a KV-sharing layer gets its target's tensor object)

    def forward(self, q, k, v, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        ctx = get_forward_context()
        if ctx is None:
            return dense_attention(q, k, v, causal=self.kind == "self", key_mask=key_mask)
        if self.impl is None:
            raise RuntimeError(f"{self.layer_name}: no attention impl bound; run it through the engine")
        out = self.impl.forward(self, q, k, v, ctx)
        ctx.record(self, out, q, k, v)          # the step's trace of cache events (see minikv.attention.context)
        return out

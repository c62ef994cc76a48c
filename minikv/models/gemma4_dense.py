"""Gemma-4's dense attention, the unpaged path of training, the tests and the hunter's reference decode (not the
engine's): each layer's K/V of every position so far, and SDPA under the causal or sliding-window mask."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_mask(q_pos: torch.Tensor, num_keys: int, window: int | None) -> torch.Tensor:
    """bool [B, 1, T, S], True = attend: causal, and within the window on a sliding layer."""
    k_pos = torch.arange(num_keys, device=q_pos.device)
    dist = q_pos[:, None, :, None] - k_pos[None, None, None, :]
    visible = dist >= 0
    if window is not None:
        visible &= dist < window
    return visible


class DenseKVCache:
    """Per-layer K/V of every position so far, for incremental dense decoding."""

    def __init__(self):
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def length(self) -> int:
        return next(iter(self.kv.values()))[0].shape[2] if self.kv else 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.kv:
            k = torch.cat([self.kv[layer][0], k], dim=2)
            v = torch.cat([self.kv[layer][1], v], dim=2)
        self.kv[layer] = (k, v)
        return k, v


def dense_attention(attn, q, k, v, positions, produced: dict, cache: DenseKVCache | None) -> torch.Tensor:
    """A Gemma4Attention's attention over q, k, v [B, T, heads, D] (k, v None in a sharing layer: it reads what
    `produced` holds for its layer type), scale 1.0; [B, T, heads * D], before o_proj."""
    q = q.transpose(1, 2)
    if attn.kv_shared:
        k, v = produced[attn.layer_type]
    else:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if attn.kv_transform is not None:       # training / dense evaluation: fake-quantized K/V
            k, v = attn.kv_transform(k), attn.kv_transform(v)
        if cache is not None:
            k, v = cache.append(attn.index, k, v)
        produced[attn.layer_type] = (k, v)      # what later sharing layers of this type attend over
    mask = attention_mask(positions, k.shape[2], attn.window)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0,
                                         enable_gqa=attn.num_heads != attn.num_kv_heads)
    return out.transpose(1, 2).flatten(-2)

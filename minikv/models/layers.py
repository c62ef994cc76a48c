"""The attention op shared by the Gemma-4 and T5 models, and the check of their token inputs.
See docs/internals.md#models-layers."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from minikv.attention.context import ForwardContext


def check_token_inputs(input_ids: torch.Tensor, positions: torch.Tensor, engine: bool) -> None:
    """Validate a model's token inputs: engine mode takes flattened [T], dense mode [B, T]."""
    if input_ids.dim() != (1 if engine else 2) or positions.shape != input_ids.shape:
        mode = "engine mode takes flattened [T]" if engine else "dense mode takes [B, T]"
        raise ValueError(f"{mode} input_ids and positions of the same shape; got input_ids "
                         f"{tuple(input_ids.shape)} and positions {tuple(positions.shape)}")


class Attention(nn.Module):
    """The paged attention op of one layer (projections live in the model)."""

    def __init__(self, layer_name: str, num_heads: int, num_kv_heads: int, head_size: int,
                 kind: str = "self", kv_sharing_target: str | None = None, *, sliding_window: int | None = None,
                 sm_scale: float | None = None):
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

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, ctx: ForwardContext,
                rel_bias: torch.Tensor | None = None) -> torch.Tensor:
        """Engine mode: q, k, v (None: the layer writes nothing) through the bound impl."""
        if rel_bias is not None and self.kind != "self":
            raise ValueError(f"{self.layer_name}: a relative position bias applies to self attention only")
        return ctx.attend(self.layer_name, q, k, v, rel_bias=rel_bias)

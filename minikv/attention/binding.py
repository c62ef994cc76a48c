"""LayerBinding: one attention layer as the engine bound it, the entry of the runner's binding table.
See docs/internals.md#attention-binding."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minikv.attention.cross import CrossAttentionImpl
from minikv.attention.impl import AttentionImpl
from minikv.cache.layout import KVLayout


def pool_name(kind: str, owner: str) -> str:
    """The arena pool of layer `owner`'s cache: "kv.<layer>" (self attention) or "cross.<layer>"."""
    return f"{'cross' if kind == 'cross' else 'kv'}.{owner}"


@dataclass(eq=False)
class LayerBinding:
    """One attention layer as the engine bound it: its pool, layout, impl and (while awake) cache tensor."""

    layer_name: str
    kind: str                                 # "self" or "cross"
    kv_sharing_target: str | None
    owner: str
    pool: str
    layout: KVLayout
    impl: AttentionImpl | CrossAttentionImpl
    op: object                                # the model's attention op (minikv.models.layers.Attention)
    kv_cache: torch.Tensor | None = None

    @property
    def owns_pool(self) -> bool:
        return self.owner == self.layer_name

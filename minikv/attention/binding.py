"""LayerBinding: one attention layer as the engine bound it, the entry of the runner's binding table.

The model runner builds one binding per attention op of the model (minikv.engine.model_runner); the forward
context looks a layer up here on every attention call (minikv.attention.context). It lives in the attention
layer because both sides read it, and the attention side must not import the engine.
"""
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
    """One attention layer as the engine bound it: the pool it reads (owned by `owner`, the layer itself or its
    KV-sharing target), the pool's layout as allocated, the impl that runs its attention, and, while the engine
    is awake, the pool's tensor (`kv_cache`; a KV-sharing layer holds the same tensor object as its owner).
    `impl.layout` is what the backend believes the pool holds; with defect B1 it differs from `layout`."""

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

"""The forward context: the per-step object the model runner passes down the model's forward call.
See docs/internals.md#attention-context."""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .metadata import AttentionMetadata
from .trace import CacheEvent

_NO_LOCK = contextlib.nullcontext()

if TYPE_CHECKING:
    from minikv.attention.binding import LayerBinding
    from minikv.attention.trace import ScaleFill


@dataclass
class ForwardContext:
    """Per-step state of one engine: the batch's metadata, the layer bindings, and what the step recorded."""

    attn_metadata: AttentionMetadata | None
    bindings: Mapping[str, LayerBinding]
    step: int = 0
    capture: bool = False          # keep copies of each layer's q, k, v and output in its event
    events: list[CacheEvent] = field(default_factory=list)
    scale_fills: list[ScaleFill] = field(default_factory=list)
    # (layer name, 0-dim bool tensor "its output was finite"): kept lazily, looked at only when logits are not.
    # Two launches a layer, so kept only where a check reads them (sanitize=True).
    finite: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    watch_finite: bool = True
    # kv_sharing_fast_prefill: the rows the KV-sharing layers compute, their metadata, and "the model cut them"
    shared_rows: torch.Tensor | None = None
    shared_metadata: AttentionMetadata | None = None
    rows_kept: bool = False
    # CUDA-graph decode (minikv.engine.cuda_graph): "eager", or "captured" / "replayed" with the graph's batch size
    cuda_graph: str = "eager"
    graph_batch: int = 0

    def attend(self, layer_name: str, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
               rel_bias: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of layer `layer_name` through its bound impl and cache; records the step's trace."""
        binding = self.bindings.get(layer_name)
        if binding is None:
            raise RuntimeError(f"{layer_name}: no attention impl bound to this layer; run the model through the "
                               f"engine (minikv.LLM), or call it without ctx for dense attention")
        with getattr(binding.impl.ops, "lock", _NO_LOCK):     # KernelOps.lock; an adapter's kernels need none
            out, access = binding.impl.forward(q, k, v, binding.kv_cache, self.attn_metadata, step=self.step,
                                               rel_bias=rel_bias)
        if access.scale_fill is not None:
            self.scale_fills.append(access.scale_fill)
        if self.attn_metadata is None:
            return out                      # warmup: nothing is read, and the slots are all -1
        tensors = None
        if self.capture:
            copy = (lambda t: None if t is None else t.detach().clone())
            tensors = {"q": copy(q), "k": copy(k), "v": copy(v), "out": copy(out)}
        self.events.append(CacheEvent(layer_name, binding.kind, binding.pool, wrote=access.wrote, read=access.read,
                                      context_path=access.context_path, context_dispatch=access.context_dispatch,
                                      read_layout=access.read_layout, tensors=tensors))
        if self.watch_finite:
            self.finite.append((layer_name, torch.isfinite(out).all()))
        return out

    def first_non_finite_layer(self) -> str | None:
        """The first layer (in execution order) whose attention output held NaN or inf, if any."""
        return next((name for name, ok in self.finite if not bool(ok)), None)

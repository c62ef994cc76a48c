"""The forward context: how the model runner hands per-step state to attention layers deep inside a model.

The runner wraps each forward pass in `set_forward_context(ctx)`; attention layers call `get_forward_context()`.
None means "no engine" (training, or the dense golden reference); a context whose `attn_metadata` is None is the
warmup (dummy) forward, where attention impls return early.

The current context is held in a `contextvars.ContextVar`, not in a module global: each thread (and each asyncio
task) sees only the context its own engine set, so two engines can run forward passes in two threads at once.
Everything a step produces (the trace of cache events) lives on the `ForwardContext` object, which belongs to
the engine that created it.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass, field

import torch

from .metadata import AttentionMetadata


@dataclass(frozen=True)
class CacheEvent:
    """What one attention layer did with the KV cache in one step.

    `pool`: the arena pool the layer's cache tensor is (a KV-sharing layer names its target's pool).
    `wrote`: the layer wrote new K/V into that pool this step; `read`: its attention read K/V from it.
    `context_path`: cross attention's context (prefill) step only: "fused" (K/V read back from the paged cache)
    or "unfused" (K/V from the 16-bit workspace); None otherwise.
    """

    layer: str
    kind: str                   # "self" or "cross"
    pool: str
    wrote: bool
    read: bool
    context_path: str | None = None
    # Only with `LLM.step(capture=True)`: copies of the layer's q, k, v (k, v None for a KV-sharing layer and at
    # a cross decode step) and attention output, flattened over the batch's tokens.
    tensors: dict | None = field(default=None, compare=False, repr=False)


@dataclass
class ForwardContext:
    """Per-step state of one engine: the batch's metadata, the step index, and the cache events recorded."""

    attn_metadata: AttentionMetadata | None
    step: int = 0
    # pool name of each cache tensor, keyed by id(tensor): lets an event name the pool a layer touched.
    pool_names: dict[int, str] = field(default_factory=dict)
    events: list[CacheEvent] = field(default_factory=list)
    capture: bool = False          # keep copies of each layer's q, k, v and output in its event
    # (layer name, 0-dim bool tensor "its output was finite"): kept lazily, looked at only when logits are not.
    finite: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def record(self, layer, out: torch.Tensor, q=None, k=None, v=None) -> None:
        """Record what `layer` (a minikv.models.layers.Attention) just did; called once per layer per step."""
        md = self.attn_metadata
        if md is None:
            return                      # warmup: nothing is read, and the slots are all -1
        pool = self.pool_names.get(id(layer.kv_cache), "?")
        if layer.kind == "cross":
            path = getattr(layer.impl, "last_context_path", None) if md.is_prefill else None
            event = CacheEvent(layer.layer_name, "cross", pool, wrote=md.is_prefill,
                               read=not (md.is_prefill and path == "unfused"), context_path=path)
        else:
            event = CacheEvent(layer.layer_name, "self", pool, wrote=layer.kv_sharing_target is None, read=True)
        if self.capture:
            copy = (lambda t: None if t is None else t.detach().clone())
            event = dataclasses.replace(event, tensors={"q": copy(q), "k": copy(k), "v": copy(v), "out": copy(out)})
        self.events.append(event)
        self.finite.append((layer.layer_name, torch.isfinite(out).all()))

    def first_non_finite_layer(self) -> str | None:
        """The first layer (in execution order) whose attention output held NaN or inf, if any."""
        for name, ok in self.finite:
            if not bool(ok):
                return name
        return None


_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar("minikv_forward_context",
                                                                                  default=None)


def get_forward_context() -> ForwardContext | None:
    return _current.get()


@contextlib.contextmanager
def set_forward_context(ctx: ForwardContext):
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)

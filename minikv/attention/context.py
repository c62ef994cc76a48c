"""The forward context: how the model runner hands per-step state to attention layers deep inside a model.

The runner wraps each forward pass in `set_forward_context(...)`. Attention layers call `get_forward_context()`:
None means "no engine" (training, or the dense golden reference); a context whose `attn_metadata` is None is
the warmup (dummy) forward, where attention impls return early.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from .metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata | None
    step: int = 0
    # Free-form per-step notes written by impls (for instrumentation); read by the runner after the step.
    notes: dict = field(default_factory=dict)


_current: ForwardContext | None = None


def get_forward_context() -> ForwardContext | None:
    return _current


@contextlib.contextmanager
def set_forward_context(ctx: ForwardContext):
    global _current
    previous, _current = _current, ctx
    try:
        yield ctx
    finally:
        _current = previous

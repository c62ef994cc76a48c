"""What attention records about the cache: an impl's `Access` per call, the trace's `CacheEvent`s, the scale fills.

An attention impl returns an `Access` beside its output; the forward context (minikv.attention.context) turns
each into a `CacheEvent` of the step's trace (minikv.engine.step). All are plain records, imported by the impls,
the context and the engine alike, so they sit in a module of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Access:
    """What an attention impl did with its cache in one call: the trace data it returns beside its output.

    `wrote`: it wrote new K/V into its pool; `read`: its attention read K/V from the pool; `read_layout`: the
    layout that read addressed the pool with (the impl's own, or what the historical B2 context path is told);
    `context_path`: cross attention's context step only, "fused" or "unfused"; `context_dispatch`: why it took
    that path (as `CacheEvent.context_dispatch`); `scale_fill`: the fill of the pool's scale regions this call
    made, if any (defect A's instrumentation)."""

    wrote: bool = False
    read: bool = False
    read_layout: object | None = None
    context_path: str | None = None
    context_dispatch: str | None = None
    scale_fill: ScaleFill | None = None


@dataclass(frozen=True)
class CacheEvent:
    """What one attention layer did with the KV cache in one step.

    `pool`: the arena pool the layer's cache tensor is (a KV-sharing layer names its target's pool).
    `wrote`: the layer wrote new K/V into that pool this step; `read`: its attention read K/V from it.
    `context_path`: cross attention's context (prefill) step only: "fused" (K/V read back from the paged cache)
    or "unfused" (K/V from the 16-bit workspace); None otherwise. `context_dispatch`: why it took that path:
    "by shape (q_len 512 > 16)" when minikv's fused configuration picked it from the step's longest query
    (minikv.attention.cross.context_path_for), "by config (...)" when the layer's configuration fixed it
    (upstream's fallback, the historical B2 read, a float32 model); None when `context_path` is. `read_layout`:
    the layout its read addressed the pool with (None when it read nothing).
    """

    layer: str
    kind: str                   # "self" or "cross"
    pool: str
    wrote: bool
    read: bool
    context_path: str | None = None
    context_dispatch: str | None = None
    read_layout: object | None = field(default=None, compare=False, repr=False)
    # Only with `LLM.step(capture=True)`: copies of the layer's q, k, v (k, v None for a KV-sharing layer and at
    # a cross decode step) and attention output, flattened over the batch's tokens.
    tensors: dict | None = field(default=None, compare=False, repr=False)


@dataclass
class ScaleFill:
    """One fill of a storage's scale regions with 1.0, as seen by the census."""

    layer: str
    step: int                     # -1: during warmup
    storage_key: tuple[int, int]
    overwritten: int              # written scales (not 0.0, not 1.0) that the fill replaced
    wiped_k_scales: torch.Tensor | None = None   # the overwritten K scales [blocks, block_size, heads], if any
    wiped_v_scales: torch.Tensor | None = None


@dataclass
class ScaleFillCensus:
    """Every scale-region fill of one engine: fills that wipe nothing versus late fills that wipe written scales."""

    fills: list[ScaleFill] = field(default_factory=list)

    def record(self, fill: ScaleFill) -> None:
        self.fills.append(fill)

    @property
    def harmless(self) -> list[ScaleFill]:
        return [f for f in self.fills if f.overwritten == 0]

    @property
    def wiping(self) -> list[ScaleFill]:
        return [f for f in self.fills if f.overwritten > 0]

    def summary(self) -> str:
        wiped = ", ".join(f"{f.layer}@step{f.step}: {f.overwritten:,}" for f in self.wiping) or "none"
        return f"{len(self.fills)} fills: {len(self.harmless)} wiped nothing; late fills that wiped scales: {wiped}"

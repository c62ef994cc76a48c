"""What attention records about the cache: an impl's `Access` per call, the trace's `CacheEvent`s, the scale fills.
See docs/internals.md#attention-trace."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Access:
    """What an attention impl did with its cache in one call: the trace data it returns beside its output."""

    wrote: bool = False
    read: bool = False
    read_layout: object | None = None
    context_path: str | None = None
    context_dispatch: str | None = None
    scale_fill: ScaleFill | None = None


@dataclass(frozen=True)
class CacheEvent:
    """What one attention layer did with the KV cache in one step."""

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

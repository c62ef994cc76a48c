"""Scenario: one engine configuration and the requests it serves, the unit the hunter generates and shrinks.
See docs/internals.md#hunt-scenario."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

DTYPES = ("float16", "float32")
SLEEP_MODES = ("discard", "free")


@dataclass(frozen=True)
class Request:
    prompt: str
    max_tokens: int
    arrival: int = 0             # engine steps after the wave's first step


@dataclass(frozen=True)
class Scenario:
    model: str
    kv_cache_dtype: str
    dtype: str = "float32"       # activation dtype, by name (DTYPES)
    requests: tuple[Request, ...] = ()
    kv_scale_placement: str = "row"
    block_size: int = 16
    max_num_seqs: int = 1
    enable_prefix_caching: bool = False
    num_blocks: int | None = None          # None: the engine sizes the pool
    cross_pool_blocks: int | None = None   # encoder-decoder models only; None: the engine sizes it
    repeat: bool = False                   # submit the same requests again after they finished
    sleep: str | None = None               # between the waves: None, "discard" or "free"
    kv_sharing_fast_prefill: bool = False  # vLLM's option: KV-sharing layers prefill the last token only
    extra: dict = field(default_factory=dict, compare=False, hash=False)   # notes for the report, not a knob

    def waves(self) -> list[tuple[Request, ...]]:
        return [self.requests, self.requests] if self.repeat else [self.requests]

    def engine_kwargs(self) -> dict:
        """The `minikv.LLM` arguments of this configuration (the dtype as a name: `torch_dtype` converts)."""
        kw = {"model": self.model, "kv_cache_dtype": self.kv_cache_dtype, "dtype": self.dtype,
              "max_num_seqs": self.max_num_seqs, "block_size": self.block_size,
              "enable_prefix_caching": self.enable_prefix_caching}
        if self.kv_scale_placement != "row":
            kw["kv_scale_placement"] = self.kv_scale_placement
        if self.num_blocks is not None:
            kw["num_blocks"] = self.num_blocks
        if self.cross_pool_blocks is not None:
            kw["cross_pool_blocks"] = self.cross_pool_blocks
        if self.kv_sharing_fast_prefill:
            kw["kv_sharing_fast_prefill"] = True
        return kw

    def key(self) -> tuple:
        """Identity for the result cache (everything that changes what runs)."""
        return (self.model, self.kv_cache_dtype, self.dtype, self.requests, self.kv_scale_placement,
                self.block_size, self.max_num_seqs, self.enable_prefix_caching, self.num_blocks,
                self.cross_pool_blocks, self.repeat, self.sleep, self.kv_sharing_fast_prefill)


def torch_dtype(name: str):
    import torch
    return {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(max(tokens, 1) / block_size)

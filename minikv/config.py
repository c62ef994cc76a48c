"""Configuration objects: how the KV cache is laid out, how requests are scheduled, what an engine is built from.

Everything the engine is built from is declared here, validated once, and then passed around read-only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minikv.kernels.formats import KV_CACHE_DTYPES, check_kv_cache_dtype  # noqa: F401  (the one format table)
from minikv.kernels.formats import check_scale_placement

if TYPE_CHECKING:                       # the model configs live with their models
    from minikv.models.gemma4 import Gemma4Config
    from minikv.models.t5 import T5Config

BLOCK_SIZES = (8, 16, 32, 64)
KV_ARENAS = ("one", "per-pool")            # minikv.cache.arena: KVArena, SeparateKVArena


def check_int(name: str, value, low: int = 1, high: int | None = None, allow_none: bool = False) -> None:
    """Raise TypeError unless `value` is an int (not a bool), ValueError unless low <= value <= high."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if allow_none else "an int"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None          # None: sized automatically
    cross_pool_blocks: int | None = None   # encoder-decoder only; None: sized automatically
    enable_prefix_caching: bool = False
    kv_scale_placement: str = "row"        # per-token-head scales: "row" (vLLM's) or "block" (minikv.cache.layout)
    kv_arena: str = "one"                  # "one" allocation for every pool (KVArena) or "per-pool" (SeparateKVArena)

    def __post_init__(self):
        # The one authority for these parameters: everything downstream takes them as given.
        check_kv_cache_dtype(self.kv_cache_dtype)
        check_int("block_size", self.block_size)
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be 8, 16, 32 or 64, got {self.block_size}")
        check_int("num_blocks", self.num_blocks, allow_none=True)
        check_int("cross_pool_blocks", self.cross_pool_blocks, allow_none=True)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        check_scale_placement(self.kv_scale_placement)
        if self.kv_arena not in KV_ARENAS:
            raise ValueError(f"kv_arena must be one of {', '.join(map(repr, KV_ARENAS))}, got {self.kv_arena!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 4096

    def __post_init__(self):
        check_int("max_num_seqs", self.max_num_seqs)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens)


@dataclass(frozen=True)
class EngineConfig:
    model: Gemma4Config | T5Config          # what the engine reads: num_layers, num_kv_heads, head_size, kv_sharing...
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: torch.device
    dtype: torch.dtype
    backend: str = "triton"                 # "triton" or "torch"
    reintroduce: tuple[str, ...] = ()
    sanitize: bool = True                   # check the arena's guard canaries after every step
    check_layout: bool = True               # check backend layout against pool layout at bind time
    seed: int = 0

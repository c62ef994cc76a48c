"""Configuration objects: what the model is, how the KV cache is laid out, how requests are scheduled.

Everything the engine is built from is declared here, validated once, and then passed around read-only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

KV_CACHE_DTYPES = ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a tiny transformer. `kv_sharing` maps a layer index to the earlier layer whose cache it reads."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    max_position: int
    kv_sharing: dict[int, int] = field(default_factory=dict)
    # encoder-decoder only
    is_encoder_decoder: bool = False
    num_encoder_layers: int = 0
    max_encoder_len: int = 0
    rope_theta: float = 10000.0

    def kv_owner(self, layer: int) -> int:
        """The layer whose cache `layer` reads: itself unless it is a KV-sharing layer."""
        return self.kv_sharing.get(layer, layer)


@dataclass(frozen=True)
class CacheConfig:
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None          # None: sized automatically
    cross_pool_blocks: int | None = None   # encoder-decoder only; None: sized automatically
    enable_prefix_caching: bool = False

    def __post_init__(self):
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; choose one of {', '.join(KV_CACHE_DTYPES)}"
            )
        if self.block_size not in (8, 16, 32, 64):
            raise ValueError(f"block_size must be 8, 16, 32 or 64, got {self.block_size}")
        for name in ("num_blocks", "cross_pool_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 4096

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: torch.device
    dtype: torch.dtype
    backend: str = "triton"                 # "triton" or "torch"
    reintroduce: tuple[str, ...] = ()
    sanitize: bool = True                   # check the arena's guard canaries after every step
    check_layout: bool = True               # check backend layout against pool layout at bind time
    seed: int = 0

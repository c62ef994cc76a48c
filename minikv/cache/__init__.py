"""The KV cache: byte layout of each format, the arena holding every pool, and the block manager."""
from .layout import KVLayout, KVLayoutMismatchError
from .arena import KVArena, KVCacheOverrunError, PoolSpec

__all__ = ["KVLayout", "KVLayoutMismatchError", "KVArena", "KVCacheOverrunError", "PoolSpec"]

"""KVLayout: the one place where the bytes of a KV-cache pool are computed.

A pool is a run of blocks. A block holds `block_size` slots for K, then `block_size` slots for V. A slot holds one
*row* per KV head. A row is the head vector's elements; the per-token-head formats add one fp32 scale per row,
placed as `scale_placement` says:

    "row" (vLLM's layout, the default): each scale right after its row's codes
        row  = [ codes: head_size * elem_bytes | scale: 4 bytes fp32 ]
    "block": each half (K or V) of a block keeps its rows' codes together, then all their scales
        half = [ codes: block_size x kv heads rows of head_size bytes | scales: [kv head][slot] fp32, padded to 16 ]
    auto, fp8 (no scales): row = [ elements: head_size * elem_bytes ], whatever the placement

"row" gives 132-byte rows (head size 128) that are only 4-byte aligned and a scattered 4-byte load per row;
"block" keeps every row 16-byte aligned (wide loads) and one head's scales of a block as one contiguous vector.

The allocator sizes pools from a layout, the kernels address pools from a layout (passed as a plain spec), and
the scale views are built from a layout. If two parties use two different layouts for one pool, they disagree
about where every block lives: that is defect B1, and `check_compatible` is the contract that catches it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minikv.kernels import formats

SCALE_BYTES = formats.SCALE_BYTES


class KVLayoutMismatchError(RuntimeError):
    """A backend was bound to a pool whose layout differs from the backend's own."""


@dataclass(frozen=True)
class KVLayout:
    kv_cache_dtype: str
    model_dtype: torch.dtype
    num_kv_heads: int
    head_size: int
    block_size: int
    scale_placement: str = "row"

    def __post_init__(self):
        formats.format_of(self.kv_cache_dtype, self.model_dtype)     # checks both, with clear errors
        formats.check_scale_placement(self.scale_placement)
        formats.check_head_size(self.head_size)
        if self.num_kv_heads < 1 or self.block_size < 1:
            raise ValueError("num_kv_heads and block_size must be positive")

    # ---- element format (all facts from the one table, kernels/formats.py) ---------------------------------
    @property
    def format(self) -> formats.Format:
        return formats.format_of(self.kv_cache_dtype, self.model_dtype)

    @property
    def fmt(self) -> int:
        return self.format.code

    @property
    def elem_bytes(self) -> int:
        return self.format.elem_bytes

    @property
    def code_dtype(self) -> torch.dtype:
        """The torch dtype of one stored element (the code, for quantized formats)."""
        return self.format.code_dtype

    @property
    def has_inline_scales(self) -> bool:
        return self.format.inline_scales

    @property
    def has_layer_scales(self) -> bool:
        """fp8 keeps one scale for K and one for V per layer, outside the pool."""
        return self.format.layer_scales

    @property
    def spec(self) -> formats.CacheSpec:
        """The typed spec the kernels address this layout's pools with."""
        return formats.CacheSpec.of(self)

    # ---- bytes --------------------------------------------------------------------------------------------
    @property
    def scales_in_block(self) -> bool:
        """Whether the scales are grouped after each block half's codes ("block" with a per-token-head format)."""
        return self.has_inline_scales and self.scale_placement == "block"

    @property
    def placement(self) -> int:
        """formats.ROW or formats.BLOCK, as the kernels see it (ROW for formats without scales)."""
        return formats.BLOCK if self.scales_in_block else formats.ROW

    @property
    def code_bytes(self) -> int:
        """Bytes of one row's codes (elements)."""
        return self.head_size * self.elem_bytes

    @property
    def row_bytes(self) -> int:
        inline = self.has_inline_scales and not self.scales_in_block
        return self.code_bytes + (SCALE_BYTES if inline else 0)

    @property
    def slot_bytes(self) -> int:
        return self.num_kv_heads * self.row_bytes

    @property
    def scale_region_bytes(self) -> int:
        """"block" placement: bytes of one half's scale region (padded so the next half stays 16-byte aligned)."""
        if not self.scales_in_block:
            return 0
        a = formats.SCALE_REGION_ALIGN
        return -(-self.block_size * self.num_kv_heads * SCALE_BYTES // a) * a

    @property
    def kv_bytes(self) -> int:
        """Bytes of one half (K or V) of a block; V starts this far into the block."""
        return self.block_size * self.slot_bytes + self.scale_region_bytes

    @property
    def scale_offset(self) -> int:
        """Where the scale of (slot 0, head 0) sits: inside the row ("row") or inside the block half ("block");
        -1 when the format has none."""
        if not self.has_inline_scales:
            return -1
        return self.block_size * self.slot_bytes if self.scales_in_block else self.code_bytes

    @property
    def scale_slot_bytes(self) -> int:
        """Bytes from the scale of slot o to that of slot o + 1 (same head); 0 without scales."""
        if not self.has_inline_scales:
            return 0
        return SCALE_BYTES if self.scales_in_block else self.slot_bytes

    @property
    def scale_head_bytes(self) -> int:
        """Bytes from the scale of head h to that of head h + 1 (same slot); 0 without scales."""
        if not self.has_inline_scales:
            return 0
        return self.block_size * SCALE_BYTES if self.scales_in_block else self.row_bytes

    @property
    def block_bytes(self) -> int:
        return 2 * self.kv_bytes

    def pool_bytes(self, num_blocks: int) -> int:
        return num_blocks * self.block_bytes

    def bytes_per_token(self) -> int:
        """KV bytes one token costs in one layer (K and V, all KV heads, scales included; not the padding)."""
        return 2 * self.num_kv_heads * (self.code_bytes + (SCALE_BYTES if self.has_inline_scales else 0))

    def row_offset(self, block: int, kv: int, slot_in_block: int, head: int) -> int:
        return block * self.block_bytes + kv * self.kv_bytes + slot_in_block * self.slot_bytes + head * self.row_bytes

    def scale_byte_offset(self, block: int, kv: int, slot_in_block: int, head: int) -> int:
        """Where the fp32 scale of one row lives (per-token-head formats)."""
        if not self.has_inline_scales:
            raise ValueError(f"{self.kv_cache_dtype} has no inline scales")
        return (block * self.block_bytes + kv * self.kv_bytes + self.scale_offset + slot_in_block
                * self.scale_slot_bytes + head * self.scale_head_bytes)

    # ---- views over a pool --------------------------------------------------------------------------------
    def _check_pool(self, pool: torch.Tensor) -> int:
        if pool.dtype != torch.uint8:
            raise TypeError(f"a pool is a uint8 tensor, got {pool.dtype}")
        nbytes = pool.numel()
        if nbytes % self.block_bytes:
            raise ValueError(f"pool of {nbytes} bytes is not a whole number of {self.block_bytes}-byte blocks")
        return nbytes // self.block_bytes

    def scale_views(self, pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 views [num_blocks, block_size, num_kv_heads] of the K and V inline scales, sharing the pool's bytes."""
        if not self.has_inline_scales:
            raise ValueError(f"{self.kv_cache_dtype} has no inline scales")
        num_blocks = self._check_pool(pool)
        if pool.storage_offset() % SCALE_BYTES or self.row_bytes % SCALE_BYTES:
            raise ValueError("inline scales must be 4-byte aligned")
        words = torch.as_strided(pool, (pool.numel(),), (1,)).view(torch.float32)
        size = (num_blocks, self.block_size, self.num_kv_heads)
        stride = (self.block_bytes // 4, self.scale_slot_bytes // 4, self.scale_head_bytes // 4)
        first = self.scale_offset // 4
        k = torch.as_strided(words, size, stride, words.storage_offset() + first)
        v = torch.as_strided(words, size, stride, words.storage_offset() + first + self.kv_bytes // 4)
        return k, v

    def code_views(self, pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [num_blocks, block_size, num_kv_heads, head_size] of the stored K and V elements."""
        num_blocks = self._check_pool(pool)
        flat = torch.as_strided(pool, (pool.numel(),), (1,))
        eb = self.elem_bytes
        if pool.storage_offset() % eb:
            raise ValueError("pool is not aligned to its element size")
        elems = flat.view(self.code_dtype)
        size = (num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        stride = (self.block_bytes // eb, self.slot_bytes // eb, self.row_bytes // eb, 1)
        k = torch.as_strided(elems, size, stride, elems.storage_offset())
        v = torch.as_strided(elems, size, stride, elems.storage_offset() + self.kv_bytes // eb)
        return k, v

    # ---- the contract ---------------------------------------------------------------------------------------
    def check_compatible(self, other: "KVLayout", where: str = "") -> None:
        """Raise KVLayoutMismatchError unless `other` addresses a pool exactly as this layout does."""
        if self.spec_tuple() != other.spec_tuple():
            at = f" for {where}" if where else ""
            raise KVLayoutMismatchError(
                f"KV layout mismatch{at}: the pool was allocated as {self.describe()} "
                f"({self.elem_bytes} byte(s) per element, {self.block_bytes} bytes per block), but the backend "
                f"addresses it as {other.describe()} ({other.elem_bytes} byte(s) per element, "
                f"{other.block_bytes} bytes per block). The backend was built with a different cache config "
                f"than the allocator; pass the same kv_cache_dtype and kv_scale_placement to both."
            )

    def spec_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, f) for f in formats.SPEC_FIELDS)

    def describe(self) -> str:
        name = formats.NAMES[self.fmt] + (", scales per block" if self.scales_in_block else "")
        return f"{name} (heads={self.num_kv_heads}, head_size={self.head_size}, block_size={self.block_size})"

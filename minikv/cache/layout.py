"""KVLayout: the one place where the bytes of a KV-cache pool are computed (into a frozen `CacheSpec`, `.spec`).
See docs/internals.md#cache-layout."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minikv.kernels import addressing, formats
from minikv.kernels.errors import CheckFailedError, InvalidTypeError, InvalidValueError

SCALE_BYTES = formats.SCALE_BYTES


class KVLayoutMismatchError(CheckFailedError, RuntimeError):
    """A backend was bound to a pool whose layout differs from the backend's own."""


def _spec_field(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.spec, name), doc=doc)


@dataclass(frozen=True)
class KVLayout:
    kv_cache_dtype: str
    model_dtype: torch.dtype
    num_kv_heads: int
    head_size: int
    block_size: int
    scale_placement: str = "row"
    # Computed once, from the fields above: the frozen byte counts the kernels address a pool with.
    spec: formats.CacheSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        fmt = formats.format_of(self.kv_cache_dtype, self.model_dtype)     # checks both, with clear errors
        formats.check_scale_placement(self.scale_placement)
        object.__setattr__(self, "spec", _compute_spec(fmt, self.num_kv_heads, self.head_size, self.block_size,
                                                       self.scale_placement))

    # ---- element format (all facts from the one table, kernels/formats.py) ---------------------------------
    @property
    def format(self) -> formats.Format:
        return formats.TABLE[self.spec.fmt]

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

    # ---- bytes: the spec's fields, read through the layout (layout.row_bytes is layout.spec.row_bytes) ------
    fmt = _spec_field("fmt", "The format code (formats.F16 ... FP8_PTH), as the kernels branch on it.")
    elem_bytes = _spec_field("elem_bytes", "Bytes of one stored element.")
    placement = _spec_field("placement", "formats.ROW or formats.BLOCK, as the kernels see it (ROW without scales).")
    row_bytes = _spec_field("row_bytes", "Bytes of one row: its codes, plus its scale with \"row\" placement.")
    slot_bytes = _spec_field("slot_bytes", "Bytes of one slot: a row per KV head.")
    kv_bytes = _spec_field("kv_bytes", "Bytes of one half (K or V) of a block; V starts this far into the block.")
    block_bytes = _spec_field("block_bytes", "Bytes of one block: the K half, then the V half.")
    scale_offset = _spec_field("scale_offset", "Where the scale of (slot 0, head 0) sits; -1 without scales.")
    scale_slot_bytes = _spec_field("scale_slot_bytes", "Bytes from one slot's scale to the next's (same head), or 0.")
    scale_head_bytes = _spec_field("scale_head_bytes", "Bytes from one head's scale to the next's (same slot), or 0.")

    @property
    def code_bytes(self) -> int:
        """Bytes of one row's codes (elements)."""
        return self.head_size * self.elem_bytes

    def pool_bytes(self, num_blocks: int) -> int:
        return num_blocks * self.block_bytes

    def bytes_per_token(self) -> int:
        """KV bytes one token costs in one layer (K and V, all KV heads, scales included; not the padding)."""
        return 2 * self.num_kv_heads * (self.code_bytes + (SCALE_BYTES if self.has_inline_scales else 0))

    def row_offset(self, block: int, kv: int, slot_in_block: int, head: int) -> int:
        """Where the row of (block, half kv, slot in block, kv head) starts (addressing.row_byte_offset)."""
        return addressing.row_byte_offset(self.spec, block, kv, slot_in_block, head)

    def scale_byte_offset(self, block: int, kv: int, slot_in_block: int, head: int) -> int:
        """Where the fp32 scale of one row lives (per-token-head formats; addressing.scale_byte_offset)."""
        if not self.has_inline_scales:
            raise InvalidValueError(f"{self.kv_cache_dtype} has no inline scales")
        return addressing.scale_byte_offset(self.spec, block, kv, slot_in_block, head)

    def _check_pool(self, pool: torch.Tensor) -> int:
        if pool.dtype != torch.uint8:
            raise InvalidTypeError(f"a pool is a uint8 tensor, got {pool.dtype}")
        nbytes = pool.numel()
        if nbytes % self.block_bytes:
            raise InvalidValueError(f"pool of {nbytes} bytes is not a whole number of {self.block_bytes}-byte blocks")
        return nbytes // self.block_bytes

    def scale_views(self, pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 views [num_blocks, block_size, num_kv_heads] of the K and V inline scales, sharing the pool's bytes."""
        if not self.has_inline_scales:
            raise InvalidValueError(f"{self.kv_cache_dtype} has no inline scales")
        num_blocks = self._check_pool(pool)
        if pool.storage_offset() % SCALE_BYTES:
            raise InvalidValueError("inline scales must be 4-byte aligned")
        words = torch.as_strided(pool, (pool.numel(),), (1,)).view(torch.float32)
        block_words, kv_words = addressing.half_word_strides(self.spec)
        slot_words, head_words, first = addressing.scale_word_strides(self.spec)
        size, stride = (num_blocks, self.block_size, self.num_kv_heads), (block_words, slot_words, head_words)
        k = torch.as_strided(words, size, stride, words.storage_offset() + first)
        v = torch.as_strided(words, size, stride, words.storage_offset() + first + kv_words)
        return k, v

    def code_views(self, pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [num_blocks, block_size, num_kv_heads, head_size] of the stored K and V elements (V's strided as its
        "block" placement stores it, transposed: addressing.v_element_strides)."""
        num_blocks = self._check_pool(pool)
        flat = torch.as_strided(pool, (pool.numel(),), (1,))
        if pool.storage_offset() % self.elem_bytes:
            raise InvalidValueError("pool is not aligned to its element size")
        elems = flat.view(self.code_dtype)
        block, kv, slot, row = addressing.element_strides(self.spec)
        size = (num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        k = torch.as_strided(elems, size, (block, slot, row, 1), elems.storage_offset())
        v = torch.as_strided(elems, size, (block, *addressing.v_element_strides(self.spec)), elems.storage_offset() + kv)
        return k, v

    def check_compatible(self, other: "KVLayout", where: str = "") -> None:
        """Raise KVLayoutMismatchError unless `other` addresses a pool exactly as this layout does."""
        if self.spec != other.spec:
            at = f" for {where}" if where else ""
            raise KVLayoutMismatchError(
                f"KV layout mismatch{at}: the pool was allocated as {self.describe()} "
                f"({self.elem_bytes} byte(s) per element, {self.block_bytes} bytes per block), but the backend "
                f"addresses it as {other.describe()} ({other.elem_bytes} byte(s) per element, "
                f"{other.block_bytes} bytes per block). The backend was built with a different cache config "
                f"than the allocator; pass the same kv_cache_dtype and kv_scale_placement to both.")

    def describe(self) -> str:
        name = formats.NAMES[self.fmt] + (", scales per block" if self.placement == formats.BLOCK else "")
        return f"{name} (heads={self.num_kv_heads}, head_size={self.head_size}, block_size={self.block_size})"


def _compute_spec(fmt: formats.Format, num_kv_heads: int, head_size: int, block_size: int,
                  scale_placement: str) -> formats.CacheSpec:
    """The byte counts of a pool of this format and shape: the one place they are computed."""
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int) or num_kv_heads < 1:
        raise InvalidValueError(f"num_kv_heads must be a positive int, got {num_kv_heads!r}")
    formats.check_head_size(head_size)
    formats.check_block_size(block_size)
    in_block = fmt.inline_scales and scale_placement == "block"
    code_bytes = head_size * fmt.elem_bytes
    row_bytes = code_bytes + (SCALE_BYTES if fmt.inline_scales and not in_block else 0)
    slot_bytes = num_kv_heads * row_bytes
    align = formats.SCALE_REGION_ALIGN
    region = -(-block_size * num_kv_heads * SCALE_BYTES // align) * align if in_block else 0
    kv_bytes = block_size * slot_bytes + region
    if not fmt.inline_scales:
        scale_offset, scale_slot, scale_head = -1, 0, 0
    elif in_block:
        scale_offset, scale_slot, scale_head = block_size * slot_bytes, SCALE_BYTES, block_size * SCALE_BYTES
    else:
        scale_offset, scale_slot, scale_head = code_bytes, slot_bytes, row_bytes
    return formats.CacheSpec(fmt=fmt.code, elem_bytes=fmt.elem_bytes, head_size=head_size, num_kv_heads=num_kv_heads,
                             block_size=block_size, row_bytes=row_bytes, slot_bytes=slot_bytes, kv_bytes=kv_bytes,
                             block_bytes=2 * kv_bytes, scale_offset=scale_offset, scale_slot_bytes=scale_slot,
                             scale_head_bytes=scale_head, placement=formats.BLOCK if in_block else formats.ROW)

"""Byte addressing of a KV pool: the one place its address formula is written, for torch and for Triton.
See docs/internals.md#kernels-addressing."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import formats

# Views of the one per-format table (formats.TABLE), under the names the kernels use.
SUPPORTED_HEAD_SIZES = formats.SUPPORTED_HEAD_SIZES
SCALE_BYTES = formats.SCALE_BYTES
CODE_DTYPES = {code: f.code_dtype for code, f in formats.TABLE.items()}
AUTO_DTYPES = {code: dtype for dtype, code in formats.AUTO_FORMATS.items()}

# The format codes as Triton compile-time constants, so kernels can branch on them by name.
F16: tl.constexpr = tl.constexpr(formats.F16)
BF16: tl.constexpr = tl.constexpr(formats.BF16)
F32: tl.constexpr = tl.constexpr(formats.F32)
FP8: tl.constexpr = tl.constexpr(formats.FP8)
INT8_PTH: tl.constexpr = tl.constexpr(formats.INT8_PTH)
FP8_PTH: tl.constexpr = tl.constexpr(formats.FP8_PTH)
SCALES_IN_ROW: tl.constexpr = tl.constexpr(formats.ROW)
V_TRANSPOSED_ABOVE: tl.constexpr = tl.constexpr(formats.V_TRANSPOSED_ABOVE)
SCALE_WORD: tl.constexpr = tl.constexpr(formats.SCALE_BYTES)     # bytes per fp32 scale word


def check_spec(spec) -> formats.CacheSpec:
    """The spec as a CacheSpec, which checks every field when it is made."""
    return formats.CacheSpec.of(spec)


# ---- torch side: the references' byte arithmetic ---------------------------------------------------------------
def row_byte_offset(spec, block, kv, slot_in_block, head):
    """Byte offset of the first code of the row of (block, half kv: 0 = K / 1 = V, slot in block, kv head); the
    "block" placement's V rows are strided (v_element_strides)."""
    slot, row = spec.slot_bytes, spec.row_bytes
    if kv and spec.placement == formats.BLOCK:          # 1-byte codes: V's element strides are byte strides
        slot, row, _ = v_element_strides(spec)
    return block * spec.block_bytes + kv * spec.kv_bytes + slot_in_block * slot + head * row


def scale_byte_offset(spec, block, kv, slot_in_block, head):
    """Byte offset of that row's fp32 scale (per-token-head formats, either placement): ints or int64 tensors."""
    return (block * spec.block_bytes + kv * spec.kv_bytes + spec.scale_offset + slot_in_block * spec.scale_slot_bytes
            + head * spec.scale_head_bytes)


def _slot_parts(spec, slots: torch.Tensor):
    """(block [N, 1], slot in block [N, 1], heads [1, H]) of cache slots `slots` (int64 [N]), for broadcasting."""
    slots = slots.to(torch.int64)
    heads = torch.arange(spec.num_kv_heads, device=slots.device, dtype=torch.int64)
    return (slots // spec.block_size)[:, None], (slots % spec.block_size)[:, None], heads[None, :]


def row_byte_offsets(spec, slots: torch.Tensor, kv: int) -> torch.Tensor:
    """int64 [N, num_kv_heads]: byte offset of each row of the cache slots `slots` (int64 [N]) in half `kv`."""
    block, in_block, heads = _slot_parts(spec, slots)
    return row_byte_offset(spec, block, kv, in_block, heads)


def slot_of(block_table, position, block_size: int):
    """The cache slot of token `position` of a sequence."""
    return block_table[position // block_size] * block_size + position % block_size


def sequence_slots(block_table_row: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """int64 [length]: the cache slot of each of a sequence's first `length` tokens."""
    n = torch.arange(length, device=block_table_row.device, dtype=torch.int64)
    return slot_of(block_table_row.to(torch.int64), n, block_size)


def _flat(pool: torch.Tensor) -> torch.Tensor:
    """The pool's bytes from its first byte to the end of its storage."""
    if not pool.is_contiguous():
        return pool.reshape(-1)
    reach = pool.untyped_storage().nbytes() // pool.element_size() - pool.storage_offset()
    return torch.as_strided(pool, (reach,), (1,))


def scale_byte_offsets(spec, slots: torch.Tensor, kv: int) -> torch.Tensor:
    """int64 [N, num_kv_heads]: byte offset of the fp32 scale of each row of `slots` in half `kv` (either placement)."""
    block, in_block, heads = _slot_parts(spec, slots)
    return scale_byte_offset(spec, block, kv, in_block, heads)


def v_element_strides(spec) -> tuple[int, int, int]:
    """(slot, head, element) strides of the V half's codes, in elements: as K's, but in the "block" placement with
    heads above formats.V_TRANSPOSED_ABOVE each kv head's codes of a block are stored [head_size, block_size]."""
    if spec.placement == formats.BLOCK and spec.head_size > formats.V_TRANSPOSED_ABOVE:
        return 1, spec.head_size * spec.block_size, spec.block_size
    return spec.slot_bytes // spec.elem_bytes, spec.row_bytes // spec.elem_bytes, 1


def code_byte_offsets(spec, slots: torch.Tensor, kv: int) -> torch.Tensor:
    """int64 [N, num_kv_heads, head_size x elem_bytes]: the byte offset of every code byte of `slots` in half `kv`."""
    d = torch.arange(spec.head_size * spec.elem_bytes, device=slots.device)
    step = v_element_strides(spec)[2] if kv else 1          # "block" placement's V: 1-byte codes, block_size apart
    return row_byte_offsets(spec, slots, kv)[:, :, None] + d * step


def gather_rows(pool: torch.Tensor, spec, slots: torch.Tensor, kv: int):
    """Read rows back: codes [N, H, D] in the format's dtype, and fp32 scales [N, H] (None without inline scales)."""
    flat, idx = _flat(pool), code_byte_offsets(spec, slots, kv)
    codes = flat[idx].view(CODE_DTYPES[spec.fmt])
    if not formats.has_inline_scales(spec.fmt):
        return codes, None
    sidx = scale_byte_offsets(spec, slots, kv)[:, :, None] + torch.arange(SCALE_BYTES, device=pool.device)
    return codes, flat[sidx].view(torch.float32)[..., 0]


def scatter_rows(pool: torch.Tensor, spec, slots: torch.Tensor, kv: int, codes: torch.Tensor,
                 scales: torch.Tensor | None) -> None:
    """Write codes [N, H, D] (format dtype) and fp32 scales [N, H] into the rows of `slots`."""
    flat, idx = _flat(pool), code_byte_offsets(spec, slots, kv)
    flat[idx] = codes.contiguous().view(torch.uint8).reshape(idx.shape)
    if scales is not None:
        sidx = scale_byte_offsets(spec, slots, kv)[:, :, None] + torch.arange(SCALE_BYTES, device=pool.device)
        flat[sidx] = scales.to(torch.float32).contiguous()[..., None].view(torch.uint8).reshape(sidx.shape)


def gather_sequence(pool: torch.Tensor, spec, block_table_row: torch.Tensor, length: int, kv: int,
                    layer_scale: float = 1.0) -> torch.Tensor:
    """float32 [length, H, D]: a sequence's K (kv=0) or V (kv=1), dequantized as the format says."""
    codes, scales = gather_rows(pool, spec, sequence_slots(block_table_row, length, spec.block_size), kv)
    x = codes.to(torch.float32)
    if scales is not None:
        x = x * scales[..., None]
    if spec.fmt == formats.FP8:
        x = x * layer_scale
    return x


# ---- torch side: what the kernels receive ---------------------------------------------------------------------
def typed_pool(pool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The pool's bytes as a flat tensor of `dtype` (the kernels index it in units of that dtype)."""
    flat = _flat(pool)
    size = torch.tensor([], dtype=dtype).element_size()
    return flat[: flat.numel() // size * size].view(dtype)


def element_strides(spec) -> tuple[int, int, int, int]:
    """(block, kv, slot, row) strides in elements of the format's code dtype."""
    eb = spec.elem_bytes
    return spec.block_bytes // eb, spec.kv_bytes // eb, spec.slot_bytes // eb, spec.row_bytes // eb


def read_views(pool: torch.Tensor, spec) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) pointers for a reading kernel: codes in the format's dtype, scales as fp32 words."""
    codes = typed_pool(pool, CODE_DTYPES[spec.fmt])
    scales = typed_pool(pool, torch.float32) if formats.has_inline_scales(spec.fmt) else codes
    return codes, scales


# ---- Triton side --------------------------------------------------------------------------------------------
def row_alignment(spec) -> int:
    """The largest power of two (at most 16 bytes' worth) dividing every row offset of the pool."""
    align = 16 // spec.elem_bytes
    for stride in element_strides(spec):
        align = math.gcd(align, stride)
    return align


def scale_word_strides(spec) -> tuple[int, int, int]:
    """(slot, head, first) of the scales in fp32 words (every spec's byte counts are whole words)."""
    if not formats.has_inline_scales(spec.fmt):
        return 0, 0, 0
    return spec.scale_slot_bytes // SCALE_BYTES, spec.scale_head_bytes // SCALE_BYTES, spec.scale_offset // SCALE_BYTES


def half_word_strides(spec) -> tuple[int, int]:
    """(block, kv) strides of the pool in fp32 words."""
    return spec.block_bytes // SCALE_BYTES, spec.kv_bytes // SCALE_BYTES


def scale_alignment(spec) -> int:
    """"block" placement: how many consecutive tokens' scales may be read as one vector."""
    if spec.placement != formats.BLOCK or spec.scale_slot_bytes != SCALE_BYTES or spec.elem_bytes != 1:
        return 1
    align = 4
    for count in (*half_word_strides(spec), *scale_word_strides(spec)[1:], spec.block_size):
        align = math.gcd(align, count)
    return align


@triton.jit
def cache_offset(block, slot_in_block, head_offset, block_stride, slot_stride):
    """The address formula (`row_byte_offset`) in the units of a typed view of the pool, K half."""
    return block * block_stride + slot_in_block * slot_stride + head_offset


@triton.jit
def block_scales(scales_ptr, block_table_ptr, n, mask, BLOCK_SIZE: tl.constexpr, block_words, slot_words,
                 head_words, SCALE_ALIGN: tl.constexpr):
    """fp32 scales of tokens `n` of one sequence and kv head, "block" placement."""
    token = n.to(tl.uint32)
    block = tl.load(block_table_ptr + token // BLOCK_SIZE, mask=mask, other=0).to(tl.int64)
    words = cache_offset(block, (token % BLOCK_SIZE).to(tl.int64), head_words, block_words, slot_words)
    words = tl.max_contiguous(tl.multiple_of(words, SCALE_ALIGN), SCALE_ALIGN)
    return tl.load(scales_ptr + words, mask=mask, other=1.0)


@triton.jit
def paged_rows(block_table_ptr, n, mask, BLOCK_SIZE: tl.constexpr, block_stride, slot_stride, head_offset,
               ROW_ALIGN: tl.constexpr):
    """Element offsets (int64) of the rows of tokens `n` of one sequence, for one kv head, in the K half."""
    token = n.to(tl.uint32)      # positions are never negative: unsigned division is a shift for 16-token blocks
    block = tl.load(block_table_ptr + token // BLOCK_SIZE, mask=mask, other=0).to(tl.int64)
    rows = cache_offset(block, (token % BLOCK_SIZE).to(tl.int64), head_offset, block_stride, slot_stride)
    return tl.multiple_of(tl.where(mask, rows, 0), ROW_ALIGN)


@triton.jit
def row_scales(scales_ptr, rows, mask, scale_offset):
    """fp32 inline scales of byte-element rows `rows` (per-token-head formats, 1-byte codes, "row" placement)."""
    return tl.load(scales_ptr + (rows + scale_offset) // SCALE_WORD, mask=mask, other=1.0)


@triton.jit
def tile_scales(scales_ptr, table, n, rows, mask, kv_offset, scale_offset, block_words, slot_words, head_words,
                BLOCK_SIZE: tl.constexpr, SCALE_PLACEMENT: tl.constexpr, SCALE_ALIGN: tl.constexpr):
    """fp32 scales of a tile of tokens `n` of one kv head, in the K or V half, for either placement."""
    if SCALE_PLACEMENT == SCALES_IN_ROW:
        scales = row_scales(scales_ptr, rows + kv_offset, mask, scale_offset)
    else:
        scales = block_scales(scales_ptr + kv_offset // SCALE_WORD, table, n, mask, BLOCK_SIZE, block_words,
                              slot_words, head_words, SCALE_ALIGN)
    return scales

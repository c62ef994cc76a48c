"""The input checks of the kernels' entry points, run when they are called with validate=True (the engine, which
checks its inputs once when a request arrives, calls them with validate=False)."""
from __future__ import annotations

import torch

from . import formats
from .mode import INTERPRETED, require_device


def check_pool(pool: torch.Tensor, spec) -> int:
    """Raise unless `pool` is a contiguous uint8 tensor holding at least one block; return its block capacity."""
    if not isinstance(pool, torch.Tensor):
        raise TypeError(f"pool must be a torch.Tensor, got {type(pool).__name__}")
    if pool.dtype != torch.uint8:
        raise TypeError(f"a pool is a uint8 tensor of raw bytes, got {pool.dtype}")
    if not pool.is_contiguous():
        raise ValueError("the pool tensor must be contiguous")
    align = formats.SCALE_BYTES if formats.has_inline_scales(spec.fmt) else spec.elem_bytes
    if pool.data_ptr() % align:
        raise ValueError(f"the pool's first byte must be {align}-byte aligned for {formats.NAMES[spec.fmt]}")
    capacity = pool_capacity(pool, spec)
    if capacity < 1:
        raise ValueError(f"pool of {pool.numel()} bytes holds no whole {spec.block_bytes}-byte block")
    return capacity


def check_float_tensor(name: str, t, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in formats.AUTO_FORMATS:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.dtype == torch.bfloat16 and INTERPRETED:
        raise TypeError(f"{name} is bfloat16, which the Triton interpreter (CPU) cannot run; use float16 or "
                        f"float32 on CPU")


def check_int_tensor(name: str, t, dtype: torch.dtype, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def check_block_tables(block_tables: torch.Tensor, seq_lens: torch.Tensor, spec, capacity: int) -> None:
    """Every block a sequence of length seq_lens[b] uses must be a block of the pool."""
    lens = seq_lens.to("cpu", torch.int64)
    max_blocks = block_tables.shape[1]
    if bool((lens > max_blocks * spec.block_size).any()):
        raise ValueError(f"seq_lens up to {int(lens.max())} exceed what the block table holds "
                         f"({max_blocks} blocks x {spec.block_size} slots = {max_blocks * spec.block_size})")
    used = torch.arange(max_blocks)[None, :] < (lens[:, None] + spec.block_size - 1) // spec.block_size
    entries = block_tables.to("cpu", torch.int64)[used]
    bad = (entries < 0) | (entries >= capacity)
    if bool(bad.any()):
        raise ValueError(f"block table entry {int(entries[bad][0])} is outside the pool, which holds {capacity} "
                         f"blocks of {spec.block_bytes} bytes")


def check_query_against_cache(q: torch.Tensor, spec, k_scale, v_scale) -> None:
    """Checks shared by the paged readers: GQA head counts, a bfloat16 cache read by a bfloat16 q, valid fp8 scales."""
    if q.shape[1] % spec.num_kv_heads:
        raise ValueError(f"q has {q.shape[1]} heads, not a multiple of the cache's {spec.num_kv_heads} kv heads")
    if spec.fmt == formats.AUTO_FORMATS[torch.bfloat16] and q.dtype != torch.bfloat16:
        raise TypeError("a bfloat16 cache needs a bfloat16 q")
    if spec.fmt == formats.FP8:
        check_scale("k_scale", k_scale)
        check_scale("v_scale", v_scale)


def check_scale(name: str, value) -> None:
    if not isinstance(value, (int, float)) or not (0.0 < float(value) < float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def pool_capacity(pool: torch.Tensor, spec) -> int:
    return pool.numel() // spec.block_bytes


def check_rel_bias(rel_bias, q) -> None:
    if rel_bias is None:
        return
    if not isinstance(rel_bias, torch.Tensor) or rel_bias.dtype != torch.float32 or rel_bias.dim() != 2:
        raise TypeError("rel_bias must be a float32 tensor [num_heads, max_distance + 1], got "
                        f"{type(rel_bias).__name__} {getattr(rel_bias, 'dtype', '')} "
                        f"{list(getattr(rel_bias, 'shape', []))}")
    if rel_bias.shape[0] != q.shape[1] or rel_bias.shape[1] < 1 or not rel_bias.is_contiguous():
        raise ValueError(f"rel_bias must be contiguous with one row per query head ({q.shape[1]}) and at least one "
                         f"column, got shape {list(rel_bias.shape)}")
    if rel_bias.device != q.device:
        raise ValueError(f"rel_bias is on {rel_bias.device}, q on {q.device}")


def check_window(sliding_window) -> None:
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 0):
        raise ValueError(f"sliding_window must be an int >= 0 (0 or None = no window), got {sliding_window!r}")


def check_decode_inputs(q, pool, block_tables, seq_lens, spec, k_scale, v_scale, out) -> None:
    """paged_decode_attention's and its reference's inputs."""
    formats.CacheSpec.of(spec)                      # a spec checks every field when it is made
    check_float_tensor("q", q, 3)
    check_int_tensor("block_tables", block_tables, torch.int32, 2)
    check_int_tensor("seq_lens", seq_lens, torch.int32, 1)
    capacity = check_pool(pool, spec)
    require_device(q, pool, block_tables, seq_lens, out)
    batch, num_heads, head_size = q.shape
    if head_size != spec.head_size:
        raise ValueError(f"q has head size {head_size}, the cache {spec.head_size}")
    check_query_against_cache(q, spec, k_scale, v_scale)
    if block_tables.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(f"q has {batch} sequences but block_tables has {block_tables.shape[0]} rows and "
                         f"seq_lens {seq_lens.shape[0]} entries")
    if out is not None and (tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(f"out must be a {q.dtype} tensor of shape {list(q.shape)} with unit last stride, got "
                         f"{out.dtype} {list(out.shape)}")
    if batch and int(seq_lens.min()) < 1:
        raise ValueError("every seq_lens entry must be at least 1")
    check_block_tables(block_tables, seq_lens, spec, capacity)

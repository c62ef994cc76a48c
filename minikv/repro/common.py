"""Helpers shared by the reproductions: reading a request's K/V back from the cache, formatting index sets."""
from __future__ import annotations

import torch


def dequantized_rows(layout, pool: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [len(slots), heads, head_size] in float32 as the kernels see them: codes times the stored scales."""
    k_codes, v_codes = layout.code_views(pool)
    idx = torch.tensor(slots, device=pool.device)
    blocks, offs = idx // layout.block_size, idx % layout.block_size
    k = k_codes[blocks, offs].float()
    v = v_codes[blocks, offs].float()
    if layout.has_inline_scales:
        ks, vs = layout.scale_views(pool)
        k = k * ks[blocks, offs][..., None]
        v = v * vs[blocks, offs][..., None]
    return k, v


def stored_scales(layout, pool: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The inline K and V scales [len(slots), heads] of the given slots."""
    ks, vs = layout.scale_views(pool)
    idx = torch.tensor(slots, device=pool.device)
    blocks, offs = idx // layout.block_size, idx % layout.block_size
    return ks[blocks, offs].clone(), vs[blocks, offs].clone()


def ranges(indices) -> str:
    """[0, 1, 2, 3, 7] -> '0-3, 7'; [] -> 'none'."""
    indices = sorted(indices)
    if not indices:
        return "none"
    out, start, prev = [], indices[0], indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if i is not None:
            start = prev = i
    return ", ".join(out)

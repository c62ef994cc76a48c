"""Defects planted in a wrapped adapter, to show that the backend hunt finds them (tests, results).

`planted(name, plant)` is adapter `name` behind a wrapper that changes what it is given, as a faulty adapter would:
stride-twice (the V pages' block stride counted twice), scale-ignored (fp8's v_scale taken as 1, the per-token-head
V scales unread), full-last-page (the last page dropped when a request exactly fills its last block),
window-off-by-one (a sliding window one token wider than asked)."""
from __future__ import annotations

import dataclasses

import torch

from minikv.attention.protocol import Adapter, CacheWrite, ContextStep, DecodeStep, PagedPool

PLANTS = ("stride-twice", "scale-ignored", "full-last-page", "window-off-by-one")


class Planted(Adapter):
    def __init__(self, inner: Adapter, plant: str, name: str | None = None):
        if plant not in PLANTS:
            raise ValueError(f"unknown plant {plant!r}; the plants are {', '.join(PLANTS)}")
        self.inner, self.plant = inner, plant
        self.name = f"{inner.name}+{plant}"
        self.features = inner.features
        self._recipe = f"minikv.hunt.plants.planted({(name or inner.name)!r}, {plant!r})"

    def _pool(self, pool: PagedPool) -> PagedPool:
        if self.plant == "stride-twice":
            # as many pages as the allocation holds at the doubled stride: the reads stay inside it, and a block
            # past them is an IndexError (`_reach`), raised on the host so that a GPU's context survives it
            v = pool.v_pages
            room = v.untyped_storage().nbytes() // v.element_size() - v.storage_offset()
            last_row = sum((n - 1) * st for n, st in zip(v.shape[1:], v.stride()[1:])) + 1
            pages = max(1, min(v.shape[0], (room - last_row) // (2 * v.stride(0)) + 1))
            stride = (2 * v.stride(0), *v.stride()[1:])
            return dataclasses.replace(pool, v_pages=torch.as_strided(v, (pages, *v.shape[1:]), stride,
                                                                      v.storage_offset()))
        if self.plant == "scale-ignored":
            return dataclasses.replace(pool, v_scale=1.0, v_page_scales=None)
        return pool

    def _reach(self, pool: PagedPool, blocks: torch.Tensor) -> None:
        if self.plant == "stride-twice" and blocks.numel() and int(blocks.max()) >= pool.v_pages.shape[0]:
            raise IndexError(f"block {int(blocks.max())} is past the {pool.v_pages.shape[0]} pages the doubled "
                             "stride leaves in the allocation")

    def _lens(self, seq_lens: torch.Tensor, pool: PagedPool) -> torch.Tensor:
        if self.plant != "full-last-page":
            return seq_lens
        full = (seq_lens % pool.block_size == 0)
        return torch.where(full, seq_lens - pool.block_size, seq_lens)

    def _window(self, window: int) -> int:
        return window + 1 if self.plant == "window-off-by-one" and window else window

    def write(self, w: CacheWrite) -> None:
        pool = self._pool(w.pool)
        self._reach(pool, w.slot_mapping[w.slot_mapping >= 0] // pool.block_size)
        self.inner.write(dataclasses.replace(w, pool=pool))

    def decode_step(self, s: DecodeStep) -> torch.Tensor:
        pool = self._pool(s.pool)
        self._reach(pool, s.block_tables)
        return self.inner.decode_step(dataclasses.replace(s, pool=pool,
                                                          seq_lens=self._lens(s.seq_lens, s.pool),
                                                          sliding_window=self._window(s.sliding_window)))

    def context_step(self, s: ContextStep) -> torch.Tensor:
        pool = self._pool(s.pool)
        self._reach(pool, s.block_tables)
        return self.inner.context_step(dataclasses.replace(s, pool=pool,
                                                           seq_lens=self._lens(s.seq_lens, s.pool),
                                                           sliding_window=self._window(s.sliding_window)))

    def workspace_step(self, s):
        return self.inner.workspace_step(dataclasses.replace(s, sliding_window=self._window(s.sliding_window)))

    def __repr__(self) -> str:
        return self._recipe


def planted(name: str, plant: str) -> Planted:
    """The adapter called `name` with `plant` in it."""
    from minikv.attention import backends
    return Planted(backends.get(name), plant, name)

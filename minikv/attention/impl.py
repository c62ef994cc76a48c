"""AttentionImpl: one decoder self-attention layer's access to the paged KV cache. Home of defect A.
See docs/internals.md#attention-impl."""
from __future__ import annotations

import weakref
from typing import ClassVar

import torch

from minikv.attention.backend import KernelOps
from minikv.attention.metadata import AttentionMetadata
from minikv.attention.trace import Access, ScaleFill, ScaleFillCensus
from minikv.cache.layout import KVLayout


def storage_key(kv_cache: torch.Tensor) -> tuple[int, int]:
    """(first byte's address, size in bytes): two layers packed in one allocation get different keys."""
    return kv_cache.data_ptr(), kv_cache.numel() * kv_cache.element_size()


def release_scale_init(kv_cache: torch.Tensor) -> None:
    """Forget that `kv_cache`'s scale regions were initialized (its contents were discarded, e.g. by sleep)."""
    AttentionImpl._initialized_storages.pop(storage_key(kv_cache), None)


class AttentionImpl:
    """Self-attention over a paged cache (causal prefill, single-token decode)."""

    # FIX (scale-wipe): initialized storage regions, (data_ptr, nbytes) -> weak reference to their storage
    _initialized_storages: ClassVar[dict[tuple[int, int], weakref.ref]] = {}

    def __init__(self, layer_name: str, num_heads: int, layout: KVLayout, ops: KernelOps, *,
                 kv_sharing_target: str | None = None, historical_scale_init: bool = False,
                 census: ScaleFillCensus | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                 sliding_window: int = 0, sm_scale: float | None = None):
        if num_heads % layout.num_kv_heads:
            raise ValueError(f"{layer_name}: {num_heads} query heads are not a multiple of "
                             f"{layout.num_kv_heads} KV heads")
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.layout = layout
        self.ops = ops
        self.kv_sharing_target = kv_sharing_target
        self.historical_scale_init = historical_scale_init
        self.census = census if census is not None else ScaleFillCensus()
        self.k_scale, self.v_scale = k_scale, v_scale
        self.sm_scale = layout.head_size ** -0.5 if sm_scale is None else float(sm_scale)
        self.sliding_window = int(sliding_window or 0)      # 0: no window
        self._views: tuple[torch.Tensor, torch.Tensor] | None = None
        self._views_of: tuple | None = None      # (key, registry entry) the fixed path's views were built for

    # ---- the defect site: inline-scale views -----------------------------------------------------------------
    def scale_views(self, kv_cache: torch.Tensor, step: int = -1) -> ScaleFill | None:
        """Build fp32 views of `kv_cache`'s inline scales; return the fill this touch made, if any."""
        if not self.layout.has_inline_scales:
            return None
        if self.historical_scale_init:
            return self._scale_views_historical(kv_cache, step)
        return self._scale_views_once_per_storage(kv_cache, step)

    def _scale_views_historical(self, kv_cache, step):
        # HISTORICAL (scale-wipe): lazy, per impl instance, as upstream's `_ensure_scale_caches`. Once this impl has
        # its views it returns early for good; the first time it gets here it fills all of the storage's scale
        # regions with 1.0, whether or not another impl already wrote real scales there.
        if self._views is not None:
            return None
        k, v = self.layout.scale_views(kv_cache)
        self._views = (k, v)
        return self._fill(k, v, kv_cache, step)

    def _scale_views_once_per_storage(self, kv_cache, step):
        # FIX (scale-wipe): the fill happens once per storage region, whichever impl touches it first. The registry
        # is consulted on every touch (one dict lookup), so a region released by sleep, or a new allocation at an
        # old address, is initialized before anything is written into it.
        storage = kv_cache.untyped_storage()
        key = storage_key(kv_cache)
        known = AttentionImpl._initialized_storages.get(key)
        fresh = known is None or known() is not storage
        fill = None
        if fresh or self._views is None or self._views_of != (key, known):
            k, v = self.layout.scale_views(kv_cache)
            if fresh:
                fill = self._fill(k, v, kv_cache, step)
                known = AttentionImpl._initialized_storages[key] = weakref.ref(storage)
            self._views, self._views_of = (k, v), (key, known)
        return fill

    def _fill(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, step: int) -> ScaleFill:
        overwritten = int(((k != 0) & (k != 1)).sum() + ((v != 0) & (v != 1)).sum())     # scales someone wrote
        fill = ScaleFill(self.layer_name, step, storage_key(kv_cache), overwritten)
        if overwritten:
            fill.wiped_k_scales, fill.wiped_v_scales = k.detach().clone(), v.detach().clone()
        self.census.record(fill)
        k.fill_(1.0)
        v.fill_(1.0)
        return fill

    @property
    def has_scale_views(self) -> bool:
        """Whether this impl has built its inline-scale views (i.e. touched a cache storage) yet."""
        return self._views is not None

    def forget_storage(self) -> None:
        """Drop this impl's views (the fixed runner calls it when sleep() frees the cache)."""
        self._views, self._views_of = None, None

    def write_cache(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    slot_mapping: torch.Tensor, step: int = -1) -> ScaleFill | None:
        """Quantize and scatter the new tokens' K/V into their slots; return the scale fill, if any."""
        fill = self.scale_views(kv_cache, step)
        self.ops.write_kv(key, value, kv_cache, slot_mapping, spec=self.layout.spec, k_scale=self.k_scale,
                          v_scale=self.v_scale, validate=False)
        return fill

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, kv_cache: torch.Tensor,
                md: AttentionMetadata | None, *, step: int,
                rel_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, Access]:
        """Attention of the step's queries over `kv_cache`; returns the output and what it did."""
        owner = self.kv_sharing_target is None
        if md is None:
            # Warmup (dummy) forward: no attention metadata. A KV-owning layer still runs its cache-update step,
            # with every slot -1 so nothing is written; a KV-sharing layer does nothing at all.
            fill = None
            if owner:
                none = torch.full((k.shape[0],), -1, dtype=torch.int64, device=k.device)
                fill = self.write_cache(kv_cache, k, v, none, step)
            return torch.zeros_like(q), Access(scale_fill=fill)
        # The first touch of the storage, an owner's or (defect A's site) a sharing layer's, may fill its scales.
        fill = self.write_cache(kv_cache, k, v, md.slot_mapping, step) if owner else self.scale_views(kv_cache, step)
        spec = self.layout.spec
        if md.is_prefill:
            out = self.ops.paged_context(q, kv_cache, block_tables=md.block_tables, cu_seqlens_q=md.query_start_loc,
                                         seq_lens=md.seq_lens, spec=spec, causal=True, sm_scale=self.sm_scale,
                                         k_scale=self.k_scale, v_scale=self.v_scale, validate=False,
                                         sliding_window=self.sliding_window, rel_bias=rel_bias)
        else:
            out = self.ops.decode(q, kv_cache, block_tables=md.block_tables, seq_lens=md.seq_lens, spec=spec,
                                  sm_scale=self.sm_scale, k_scale=self.k_scale, v_scale=self.v_scale, validate=False,
                                  sliding_window=self.sliding_window, rel_bias=rel_bias)
        return out, Access(wrote=owner, read=True, read_layout=self.layout, scale_fill=fill)

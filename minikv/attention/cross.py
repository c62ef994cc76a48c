"""Cross attention over the encoder's K/V in the cross pool. Home of defects B1 and B2.

The cross K/V of a request are projected from the encoder output once, at the decoder's context (prefill) step,
written into the cross pool, and read at every decode step.

B1, `cross-stride` — which layout the cross backend is built with (`CrossBackendBuilder`):
  HISTORICAL: the cross-attention layer builds its backend without the model's quantization config, so the
  backend's layout says "auto" (16-bit elements) while the allocator sized the cross pool from the quantized
  config (1 byte per element). Writes and reads share the doubled stride, so a pool of at least twice the needed
  blocks happens to work; a smaller one runs past its end.
  FIX: pass the quantization config, both when the backend is built eagerly and when weights are created later.

B2, `cross-fp8-context-read` — what the fused context path is told about the cache (`_context_read_layout`):
  HISTORICAL: the fused context kernel reads the encoder K/V back from the paged cross cache but is given the
  cache's data type only when `paged_context` is on; otherwise it reads fp8 bytes as 16-bit elements.
  UPSTREAM FIX ("fallback"): use the unfused path (K/V from the 16-bit workspace) for cross attention with a
  quantized cache unless `paged_context` is on.
  MINIKV ("fused", the default): the fused kernel is always given the cache's real layout; no fallback needed.
"""
from __future__ import annotations

import torch

from minikv.attention.backend import KernelOps
from minikv.attention.context import ForwardContext
from minikv.cache.layout import KVLayout

CROSS_CONTEXT_PATHS = ("fused", "fallback")
CONSTRUCTION_ORDERS = ("eager", "deferred")


class CrossBackendBuilder:
    """Decides the KVLayout a cross-attention backend addresses its pool with (the B1 site).

    Upstream builds the backend either in the layer's constructor ("eager") or when the layer's weights are
    created after the quantization config is known ("deferred"); the fix had to cover both orders.
    """

    def __init__(self, kv_cache_dtype: str, model_dtype: torch.dtype, block_size: int, *, historical: bool):
        self.kv_cache_dtype = kv_cache_dtype          # the model's quantization config, as far as the KV cache goes
        self.model_dtype = model_dtype
        self.block_size = block_size
        self.historical = historical

    def _layout(self, num_kv_heads: int, head_size: int, kv_cache_dtype: str) -> KVLayout:
        return KVLayout(kv_cache_dtype, self.model_dtype, num_kv_heads, head_size, self.block_size)

    def layout_at_construction(self, num_kv_heads: int, head_size: int) -> KVLayout:
        if self.historical:
            # HISTORICAL (cross-stride): built without the quant config: the cache is assumed to hold the
            # model's 16-bit elements.
            return self._layout(num_kv_heads, head_size, "auto")
        # FIX (cross-stride): the quant config is passed to the backend.
        return self._layout(num_kv_heads, head_size, self.kv_cache_dtype)

    def layout_at_weight_creation(self, num_kv_heads: int, head_size: int) -> KVLayout:
        if self.historical:
            # HISTORICAL (cross-stride): the deferred path forgot the quant config too.
            return self._layout(num_kv_heads, head_size, "auto")
        # FIX (cross-stride): the deferred path passes it as well.
        return self._layout(num_kv_heads, head_size, self.kv_cache_dtype)

    def build(self, order: str, num_kv_heads: int, head_size: int) -> KVLayout:
        if order not in CONSTRUCTION_ORDERS:
            raise ValueError(f"construction order must be one of {CONSTRUCTION_ORDERS}, got {order!r}")
        if order == "eager":
            return self.layout_at_construction(num_kv_heads, head_size)
        return self.layout_at_weight_creation(num_kv_heads, head_size)


class CrossAttentionImpl:
    """Non-causal attention of decoder tokens over their request's encoder K/V in the cross pool."""

    def __init__(self, layer_name: str, num_heads: int, layout: KVLayout, ops: KernelOps, *,
                 context_path: str = "fused", paged_context: bool = False, historical_context_read: bool = False,
                 k_scale: float = 1.0, v_scale: float = 1.0):
        if context_path not in CROSS_CONTEXT_PATHS:
            raise ValueError(f"cross context path must be one of {CROSS_CONTEXT_PATHS}, got {context_path!r}")
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.layout = layout                  # what this backend believes the pool holds (B1 decides it)
        self.ops = ops
        self.context_path = context_path
        self.paged_context = paged_context
        self.historical_context_read = historical_context_read
        self.k_scale, self.v_scale = k_scale, v_scale
        self.sm_scale = layout.head_size ** -0.5
        self.last_context_path: str | None = None   # "fused" or "unfused": which path the last context step took

    def _quantized(self) -> bool:
        return self.layout.kv_cache_dtype != "auto"

    def _use_fused(self) -> bool:
        if self.historical_context_read:
            return True                                   # upstream always took the fused kernel
        if self.context_path == "fallback":
            # Upstream fix: fall back to the unfused path for a quantized cross cache unless paged context is on.
            return not self._quantized() or self.paged_context
        return True

    def _context_read_layout(self) -> KVLayout:
        if self.historical_context_read and not self.paged_context:
            # HISTORICAL (cross-fp8-context-read): the fused kernel learns the cache's type only with paged
            # context on; otherwise it assumes the model's 16-bit elements.
            return KVLayout("auto", self.layout.model_dtype, self.layout.num_kv_heads, self.layout.head_size,
                            self.layout.block_size)
        # FIX (minikv): the fused kernel is always told the cache's real layout.
        return self.layout

    def forward(self, layer, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                ctx: ForwardContext) -> torch.Tensor:
        md = ctx.attn_metadata
        if md is None:
            return torch.zeros_like(q)                    # warmup: no metadata, no encoder, nothing to read
        cm = md.cross
        if cm is None:
            raise RuntimeError(f"{self.layer_name}: cross attention needs cross metadata")
        return self._attend(layer.kv_cache, q, k, v, md)

    def _attend(self, pool, q, k, v, md) -> torch.Tensor:
        cm = md.cross
        if md.is_prefill:
            # Context step: the encoder K/V are written once into the cross pool ...
            self.ops.write_kv(k, v, pool, cm.slot_mapping, spec=self.layout, k_scale=self.k_scale,
                              v_scale=self.v_scale, validate=False)
            if self._use_fused():
                # ... and the fused path reads them back from the cache,
                self.last_context_path = "fused"
                return self.ops.paged_context(q, pool, block_tables=cm.block_tables,
                                              cu_seqlens_q=md.query_start_loc, seq_lens=cm.encoder_seq_lens,
                                              spec=self._context_read_layout(), causal=False, sm_scale=self.sm_scale,
                                              k_scale=self.k_scale, v_scale=self.v_scale, validate=False)
            # ... while the unfused path uses the 16-bit workspace copy it already has.
            self.last_context_path = "unfused"
            return self.ops.context(q, k, v, cu_seqlens_q=md.query_start_loc, cu_seqlens_k=cm.encoder_start_loc,
                                    causal=False, sm_scale=self.sm_scale, validate=False)
        return self.ops.decode(q, pool, block_tables=cm.block_tables, seq_lens=cm.encoder_seq_lens, spec=self.layout,
                               sm_scale=self.sm_scale, k_scale=self.k_scale, v_scale=self.v_scale, validate=False)

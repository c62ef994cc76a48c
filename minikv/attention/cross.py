"""Cross attention over the encoder's K/V in the cross pool. Home of defects B1 and B2.
See docs/internals.md#attention-cross."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from minikv.attention.backend import KernelOps
from minikv.attention.metadata import AttentionMetadata
from minikv.attention.trace import Access
from minikv.cache.layout import KVLayout
from minikv.kernels import formats

logger = logging.getLogger(__name__)

B1_SITES = ("construction", "create_weights")

# The longest query (decoder tokens of one sequence) for which minikv's cross context step takes the fused kernel;
# longer queries take the unfused one. Measured on an H200 (`python -m minikv.bench attention`, the q_len sweep of
# `cross_context_cases`; results/gpu/cross-dispatch/): fused over unfused is 1.32x at q_len 1 and 4, 1.08x at 16
# (batch 64, encoder 1024), then 0.31-0.72x at every q_len from 32 to 512 (encoders 1024-4096). Measured, not
# profiled: the fused kernel's time jumps between q_len 16 and 32 while the unfused one's grows with the work.
FUSED_CROSS_MAX_QUERY_LEN = 16


def context_path_for(max_query_len: int) -> str:
    """The path minikv's fused configuration takes at a cross context step whose longest query has
    `max_query_len` tokens: "fused" up to FUSED_CROSS_MAX_QUERY_LEN, "unfused" above."""
    return "fused" if max_query_len <= FUSED_CROSS_MAX_QUERY_LEN else "unfused"


@dataclass(frozen=True)
class QuantConfig:
    """The part of a model's quantization config the KV cache cares about."""

    kv_cache_dtype: str = "auto"
    kv_scale_placement: str = "row"


class CrossAttentionBackend:
    """A cross layer's attention op as far as the cache goes: it addresses the pool as its quant config says."""

    def __init__(self, num_kv_heads: int, head_size: int, model_dtype: torch.dtype, block_size: int,
                 quant_config: QuantConfig | None = None):
        self.num_kv_heads, self.head_size = num_kv_heads, head_size
        self.model_dtype, self.block_size = model_dtype, block_size
        self.quant_config = quant_config

    def update_quant_config(self, quant_config: QuantConfig | None) -> None:
        self.quant_config = quant_config

    @property
    def layout(self) -> KVLayout:
        qc = self.quant_config if self.quant_config is not None else QuantConfig()
        return KVLayout(qc.kv_cache_dtype, self.model_dtype, self.num_kv_heads, self.head_size, self.block_size,
                        qc.kv_scale_placement)


def create_attention(num_kv_heads: int, head_size: int, model_dtype: torch.dtype, block_size: int,
                     quant_config: QuantConfig | None = None) -> CrossAttentionBackend:
    return CrossAttentionBackend(num_kv_heads, head_size, model_dtype, block_size, quant_config)


class CrossAttentionModule:
    """How a cross-attention layer gets its backend (the B1 sites), in upstream's two construction orders."""

    def __init__(self, num_kv_heads: int, head_size: int, model_dtype: torch.dtype, block_size: int,
                 quant_config: QuantConfig | None, *, skip_create_weights_in_init: bool,
                 historical_sites: frozenset[str] = frozenset()):
        unknown = set(historical_sites) - set(B1_SITES)
        if unknown:
            raise ValueError(f"unknown B1 site(s) {sorted(unknown)}; known: {B1_SITES}")
        self.quant_config = quant_config
        self.historical_sites = frozenset(historical_sites)
        self.backend: CrossAttentionBackend | None = None
        self.weights_created = False
        if not skip_create_weights_in_init:
            self.create_weights()                 # eager: the weights first, the backend below
        shape = (num_kv_heads, head_size, model_dtype, block_size)
        if "construction" in self.historical_sites:
            # HISTORICAL (cross-stride): the backend is created without the quant config.
            self.backend = create_attention(*shape)
        else:
            # FIX (cross-stride): the quant config is passed at construction.
            self.backend = create_attention(*shape, quant_config=self.quant_config)

    def create_weights(self) -> None:
        self.weights_created = True
        if self.backend is None:
            return                                # eager order: no backend yet; the constructor passes the config
        if "create_weights" in self.historical_sites:
            # HISTORICAL (cross-stride): the backend is never told the config that arrived after construction.
            return
        # FIX (cross-stride): creating the weights updates the backend with the now-known quant config.
        self.backend.update_quant_config(self.quant_config)


class CrossBackendBuilder:
    """The layout each cross layer's backend addresses its pool with, built in the chosen construction order."""

    def __init__(self, kv_cache_dtype: str, model_dtype: torch.dtype, block_size: int, *, historical: bool,
                 historical_sites: frozenset[str] | None = None, kv_scale_placement: str = "row"):
        self.quant_config = QuantConfig(kv_cache_dtype, kv_scale_placement)
        self.model_dtype = model_dtype
        self.block_size = block_size
        self.historical_sites = (frozenset(B1_SITES) if historical else frozenset()) if historical_sites is None \
            else frozenset(historical_sites)

    def module(self, order: str, num_kv_heads: int, head_size: int) -> CrossAttentionModule:
        shape = (num_kv_heads, head_size, self.model_dtype, self.block_size)
        if order == "eager":
            return CrossAttentionModule(*shape, self.quant_config, skip_create_weights_in_init=False,
                                        historical_sites=self.historical_sites)
        layer = CrossAttentionModule(*shape, None, skip_create_weights_in_init=True,
                                     historical_sites=self.historical_sites)
        layer.quant_config = self.quant_config    # the loader learns the config, then creates the weights
        layer.create_weights()
        return layer

    def build(self, order: str, num_kv_heads: int, head_size: int) -> KVLayout:
        return self.module(order, num_kv_heads, head_size).backend.layout


@dataclass(frozen=True)
class ReadLayout(formats.CacheSpec):
    """A kernel spec for a paged reader whose element format differs from the pool's (the CacheSpec fields, plus
    the model dtype the reader decodes into)."""

    model_dtype: torch.dtype = torch.float16

    def describe(self) -> str:
        return (f"{formats.NAMES[self.fmt]} elements ({self.elem_bytes} bytes each) inside the pool's "
                f"{self.block_bytes}-byte blocks (heads={self.num_kv_heads}, head_size={self.head_size}, "
                f"block_size={self.block_size})")


def sixteen_bit_read_of(pool_layout: KVLayout) -> ReadLayout:
    """HISTORICAL (cross-fp8-context-read): the pool's blocks, with their insides read as the model's
    elements."""
    auto = KVLayout("auto", pool_layout.model_dtype, pool_layout.num_kv_heads, pool_layout.head_size,
                    pool_layout.block_size)
    fields = {f: getattr(auto, f) for f in formats.SPEC_FIELDS}
    fields.update(kv_bytes=pool_layout.kv_bytes, block_bytes=pool_layout.block_bytes)
    return ReadLayout(**fields, model_dtype=pool_layout.model_dtype)


class CrossAttentionImpl:
    """Non-causal attention of decoder tokens over their request's encoder K/V in the cross pool."""

    def __init__(self, layer_name: str, num_heads: int, layout: KVLayout, ops: KernelOps, *,
                 context_path: str = "fused", paged_context: bool = False, historical_context_read: bool = False,
                 k_scale: float = 1.0, v_scale: float = 1.0, sm_scale: float | None = None):
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.layout = layout                  # what this backend believes the pool holds (B1 decides it)
        self.ops = ops
        self.context_path = context_path
        self.paged_context = paged_context
        self.historical_context_read = historical_context_read
        self.k_scale, self.v_scale = k_scale, v_scale
        self.sm_scale = layout.head_size ** -0.5 if sm_scale is None else float(sm_scale)   # T5: 1.0
        # (path, why), decided once when the op is initialized (as upstream's AttentionOp::initialize does);
        # None: minikv's fused configuration, which decides at each context step by its shape.
        self.fixed_context = None if context_path == "fused" and not historical_context_read else self._decide()

    def _quantized(self) -> bool:
        return self.layout.kv_cache_dtype != "auto"

    def _decide(self) -> tuple[str, str]:
        if self.layout.model_dtype == torch.float32:
            return "unfused", "by config (float32 model)"    # upstream has no fused fp32 context kernel
        if self.historical_context_read:
            return "fused", "by config (historical B2 read)"  # before the fix: always the fused kernel
        if self._quantized() and not self.paged_context:
            # Upstream fix: fall back to the unfused path for a quantized cross cache unless paged context is on.
            logger.warning("%s: cross attention with a %s KV cache and paged context FMHA off: the context step "
                           "falls back to the unfused path", self.layer_name, self.layout.kv_cache_dtype)
            return "unfused", f'by config ("fallback", {self.layout.kv_cache_dtype} cache, paged context off)'
        return "fused", f'by config ("fallback", {"paged context on" if self._quantized() else "16-bit cache"})'

    def _dispatch(self, max_query_len: int) -> tuple[str, str]:
        """(path, why) of a context step whose longest query has `max_query_len` tokens (a host int: no sync)."""
        if self.fixed_context is not None:
            return self.fixed_context
        path = context_path_for(max_query_len)
        sign = "<=" if path == "fused" else ">"
        return path, f"by shape (q_len {max_query_len} {sign} {FUSED_CROSS_MAX_QUERY_LEN})"

    def _context_read_layout(self):
        if self.historical_context_read and not self.paged_context:
            # HISTORICAL (cross-fp8-context-read): the fused kernel learns the cache's type only with paged
            # context on; otherwise it reads the pool's blocks as if they held the model's 16-bit elements.
            return sixteen_bit_read_of(self.layout)
        # FIX (minikv): the fused kernel is always told the cache's real layout.
        return self.layout

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, kv_cache: torch.Tensor,
                md: AttentionMetadata | None, *, step: int,
                rel_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, Access]:
        """Cross attention of the step's queries over the cross pool `kv_cache`; returns the output and what it did
        (`step` is unused: cross pools have no lazy scale fill; `rel_bias` must be None: no position bias)."""
        if rel_bias is not None:
            raise ValueError(f"{self.layer_name}: cross attention takes no relative position bias")
        if md is None:
            return torch.zeros_like(q), Access()          # warmup: no metadata, no encoder, nothing to read
        cm = md.cross
        if cm is None:
            raise RuntimeError(f"{self.layer_name}: cross attention needs cross metadata")
        spec = self.layout.spec
        if not md.is_prefill:
            out = self.ops.decode(q, kv_cache, block_tables=cm.block_tables, seq_lens=cm.encoder_seq_lens,
                                  spec=spec, sm_scale=self.sm_scale, k_scale=self.k_scale, v_scale=self.v_scale,
                                  validate=False)
            return out, Access(read=True, read_layout=self.layout)
        # Context step: the encoder K/V are written once into the cross pool ...
        self.ops.write_kv(k, v, kv_cache, cm.slot_mapping, spec=spec, k_scale=self.k_scale, v_scale=self.v_scale,
                          validate=False)
        path, why = self._dispatch(md.max_query_len)
        if path == "fused":
            # ... and the fused path reads them back from the cache,
            read = self._context_read_layout()
            out = self.ops.paged_context(q, kv_cache, block_tables=cm.block_tables, cu_seqlens_q=md.query_start_loc,
                                         seq_lens=cm.encoder_seq_lens, spec=formats.CacheSpec.of(read),
                                         causal=False, sm_scale=self.sm_scale, k_scale=self.k_scale,
                                         v_scale=self.v_scale, validate=False)
            return out, Access(wrote=True, read=True, read_layout=read, context_path="fused", context_dispatch=why)
        # ... while the unfused path uses the 16-bit workspace copy it already has.
        out = self.ops.context(q, k, v, cu_seqlens_q=md.query_start_loc, cu_seqlens_k=cm.encoder_start_loc,
                               causal=False, sm_scale=self.sm_scale, validate=False)
        return out, Access(wrote=True, context_path="unfused", context_dispatch=why)

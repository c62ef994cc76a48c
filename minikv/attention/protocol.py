"""The attention backend protocol: what minikv's engine calls, and the typed inputs a foreign kernel receives.

`AttentionBackend` is the engine side: four calls with the kernels' keyword signatures (minikv's "triton" and
"torch" `KernelOps` are instances, called with no extra work per step). `Adapter` is the stranger's side: it
implements those calls by handing one typed object to each of its methods (`PagedPool`, `CacheWrite`,
`DecodeStep`, `ContextStep`, `WorkspaceStep`). docs/backends.md is the guide, with a complete example.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from minikv.kernels import addressing, formats

FULL = {"formats": ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head"),
        "head_sizes": formats.SUPPORTED_HEAD_SIZES, "block_sizes": formats.BLOCK_SIZES}


@dataclass(frozen=True)
class Features:
    """What a backend supports; the hunter skips a family whose needs are not here, and says which one."""

    formats: tuple[str, ...] = FULL["formats"]            # kv_cache_dtype names
    placements: tuple[str, ...] = ("row", "block")         # scale placements of the per-token-head formats
    dtypes: tuple[str, ...] = ("float32", "float16")      # query / compute dtypes (by name), plainest first
    head_sizes: tuple[int, ...] = FULL["head_sizes"]
    block_sizes: tuple[int, ...] = FULL["block_sizes"]
    sliding_window: bool = True
    rel_bias: bool = True                                  # T5's relative position bias (decoder self attention)
    non_causal: bool = True                                # cross attention over an encoder's pool
    device: str = "cpu"                                    # where the hunter runs it: "cpu" or "cuda"
    notes: dict = field(default_factory=dict, compare=False)   # feature -> why it is missing


@dataclass(frozen=True)
class PagedPool:
    """One layer's paged KV pool: its bytes, their layout, and typed views of its pages (no copies).

    `k_pages` / `v_pages` are [num_blocks, block_size, num_kv_heads, head_size] in the element dtype (the code
    dtype of a quantized format), strided over the pool's bytes as `spec` says (the "block" placement stores each
    block's V codes transposed, tokens contiguous: addressing.v_element_strides); `k_page_scales` / `v_page_scales`
    are the per-token-head formats' fp32 scales [num_blocks, block_size, num_kv_heads] (None otherwise);
    `k_scale` / `v_scale` are the per-layer scales of "fp8" (1.0 for the others). Read pages through these views:
    a backend that does sees any pool minikv can lay out, both scale placements included."""

    data: torch.Tensor                 # uint8: the pool's bytes
    spec: formats.CacheSpec            # block size, element format, scale placement, every stride in bytes
    k_pages: torch.Tensor
    v_pages: torch.Tensor
    k_page_scales: torch.Tensor | None
    v_page_scales: torch.Tensor | None
    k_scale: float = 1.0
    v_scale: float = 1.0

    @classmethod
    def of(cls, pool: torch.Tensor, spec, k_scale: float = 1.0, v_scale: float = 1.0) -> PagedPool:
        spec = formats.CacheSpec.of(spec)
        num_blocks = pool.numel() // spec.block_bytes
        flat = torch.as_strided(pool, (num_blocks * spec.block_bytes,), (1,))
        elems = flat.view(formats.TABLE[spec.fmt].code_dtype)
        block, kv, slot, row = addressing.element_strides(spec)
        size = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
        k = torch.as_strided(elems, size, (block, slot, row, 1), elems.storage_offset())
        v = torch.as_strided(elems, size, (block, *addressing.v_element_strides(spec)), elems.storage_offset() + kv)
        ks = vs = None
        if formats.has_inline_scales(spec.fmt):
            words = flat.view(torch.float32)
            block_w, kv_w = addressing.half_word_strides(spec)
            slot_w, head_w, first = addressing.scale_word_strides(spec)
            ssize, sstride = size[:3], (block_w, slot_w, head_w)
            ks = torch.as_strided(words, ssize, sstride, words.storage_offset() + first)
            vs = torch.as_strided(words, ssize, sstride, words.storage_offset() + first + kv_w)
        return cls(pool, spec, k, v, ks, vs, float(k_scale), float(v_scale))

    @property
    def kv_cache_dtype(self) -> str:
        return formats.TABLE[self.spec.fmt].kv_cache_dtype

    @property
    def element_dtype(self) -> torch.dtype:
        return formats.TABLE[self.spec.fmt].code_dtype

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def pages(self, kv: int, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The pages `blocks` (int64 [n]) of K (kv=0) or V (kv=1), dequantized into `dtype`: [n, block_size,
        num_kv_heads, head_size] (a copy)."""
        pages = (self.k_pages, self.v_pages)[kv][blocks]
        if self.spec.fmt in (formats.F16, formats.BF16, formats.F32):
            return pages.to(dtype)
        x = pages.to(torch.float32)
        scales = (self.k_page_scales, self.v_page_scales)[kv]
        if scales is not None:
            x = x * scales[blocks][..., None]
        else:
            x = x * (self.k_scale, self.v_scale)[kv]
        return x.to(dtype)


@dataclass(frozen=True)
class CacheWrite:
    """Store the new tokens' K and V [T, num_kv_heads, head_size] at their cache slots (int64 [T]; slot s is
    block s // block_size, place s % block_size; -1: skip the token), quantizing as the pool's format says."""

    key: torch.Tensor
    value: torch.Tensor
    slot_mapping: torch.Tensor
    pool: PagedPool


@dataclass(frozen=True)
class DecodeStep:
    """One query token per sequence, q [B, Hq, D], over the first seq_lens[b] tokens of its block table's pages
    (block_tables int32 [B, max_blocks], seq_lens int32 [B]; the query is the last of them). sliding_window > 0:
    only the last sliding_window tokens count; rel_bias: T5's float32 [Hq, max_distance + 1], the score of key j
    gets rel_bias[h, min(seq_len - 1 - j, max_distance)] after scaling. Returns [B, Hq, D] in q's dtype."""

    q: torch.Tensor
    pool: PagedPool
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    sm_scale: float
    sliding_window: int = 0
    rel_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class ContextStep:
    """Several query tokens per sequence, q [Tq, Hq, D] (sequence b's rows cu_seqlens_q[b]:cu_seqlens_q[b+1]),
    over the first seq_lens[b] tokens of its pages. causal: query i of a sequence with q_len queries sees keys
    j <= c + i, c = seq_len - q_len, and with sliding_window > 0 only j > c + i - sliding_window; not causal
    (cross attention): every key. Returns [Tq, Hq, D] in q's dtype."""

    q: torch.Tensor
    pool: PagedPool
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    causal: bool
    sm_scale: float
    sliding_window: int = 0
    rel_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class WorkspaceStep:
    """A context step whose K/V come from the workspace, k/v [Tk, Hkv, D] (not from the pool): the unfused path."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    causal: bool
    sm_scale: float
    sliding_window: int = 0
    rel_bias: torch.Tensor | None = None


@runtime_checkable
class AttentionBackend(Protocol):
    """What the engine calls (validate=False on its path; `out`, when given, receives the result)."""

    name: str

    def write_kv(self, key, value, pool, slot_mapping, spec, k_scale=1.0, v_scale=1.0, validate=True) -> None: ...

    def decode(self, q, pool, block_tables, seq_lens, spec, sm_scale, k_scale=1.0, v_scale=1.0, out=None,
               validate=True, sliding_window=0, rel_bias=None) -> torch.Tensor: ...

    def context(self, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, sm_scale, validate=True, sliding_window=0,
                rel_bias=None) -> torch.Tensor: ...

    def paged_context(self, q, pool, block_tables, cu_seqlens_q, seq_lens, spec, causal, sm_scale, k_scale=1.0,
                      v_scale=1.0, validate=True, sliding_window=0, rel_bias=None) -> torch.Tensor: ...


class Adapter:
    """Base of a foreign backend: implement `decode_step` and `context_step` (and `write`, `workspace_step` to
    test your own; the defaults are plain torch). The four engine calls below turn into those."""

    name = "adapter"
    features = Features()

    # ---- what an adapter implements ------------------------------------------------------------------------
    def write(self, w: CacheWrite) -> None:
        """Default: quantize in torch and store through the pool's page views."""
        keep = w.slot_mapping >= 0
        slots = w.slot_mapping[keep]
        block, place = slots // w.pool.block_size, slots % w.pool.block_size
        for x, pages, scales, layer in ((w.key, w.pool.k_pages, w.pool.k_page_scales, w.pool.k_scale),
                                        (w.value, w.pool.v_pages, w.pool.v_page_scales, w.pool.v_scale)):
            codes, row_scales = quantize(x[keep], w.pool.spec.fmt, layer)
            target = pages.view(torch.uint8) if pages.element_size() == 1 else pages
            target[block, place] = codes.view(target.dtype) if pages.element_size() == 1 else codes
            if scales is not None:
                scales[block, place] = row_scales

    def decode_step(self, s: DecodeStep) -> torch.Tensor:
        raise NotImplementedError

    def context_step(self, s: ContextStep) -> torch.Tensor:
        raise NotImplementedError

    def workspace_step(self, s: WorkspaceStep) -> torch.Tensor:
        """Default: torch's scaled_dot_product_attention, one sequence at a time."""
        out = torch.empty_like(s.q)
        cq, ck = s.cu_seqlens_q.tolist(), s.cu_seqlens_k.tolist()
        for b in range(len(cq) - 1):
            out[cq[b]:cq[b + 1]] = sdpa_attend(s.q[cq[b]:cq[b + 1]], s.k[ck[b]:ck[b + 1]].to(s.q.dtype),
                                               s.v[ck[b]:ck[b + 1]].to(s.q.dtype), s.causal, s.sm_scale,
                                               s.sliding_window, s.rel_bias)
        return out

    # ---- the engine's calls (AttentionBackend) -------------------------------------------------------------
    def write_kv(self, key, value, pool, slot_mapping, spec, k_scale=1.0, v_scale=1.0, validate=True) -> None:
        self.write(CacheWrite(key, value, slot_mapping, PagedPool.of(pool, spec, k_scale, v_scale)))

    def _refuse(self, sliding_window, rel_bias) -> None:
        """What the backend's Features say it lacks is refused, never ignored (one check of two Python values)."""
        f = self.features
        if rel_bias is not None and not f.rel_bias:
            raise NotImplementedError(f"{self.name}: {f.notes.get('rel_bias', 'no relative position bias')}")
        if sliding_window and not f.sliding_window:
            raise NotImplementedError(f"{self.name}: {f.notes.get('sliding_window', 'no sliding window')}")

    def decode(self, q, pool, block_tables, seq_lens, spec, sm_scale, k_scale=1.0, v_scale=1.0, out=None,
               validate=True, sliding_window=0, rel_bias=None, config=None) -> torch.Tensor:
        self._refuse(sliding_window, rel_bias)
        result = self.decode_step(DecodeStep(q, PagedPool.of(pool, spec, k_scale, v_scale), block_tables,
                                             seq_lens, float(sm_scale), int(sliding_window or 0), rel_bias))
        return result if out is None else out.copy_(result)

    def context(self, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, sm_scale, validate=True, sliding_window=0,
                rel_bias=None, config=None) -> torch.Tensor:
        self._refuse(sliding_window, rel_bias)
        return self.workspace_step(WorkspaceStep(q, k, v, cu_seqlens_q, cu_seqlens_k, bool(causal), float(sm_scale),
                                                 int(sliding_window or 0), rel_bias))

    def paged_context(self, q, pool, block_tables, cu_seqlens_q, seq_lens, spec, causal, sm_scale, k_scale=1.0,
                      v_scale=1.0, validate=True, sliding_window=0, rel_bias=None, config=None) -> torch.Tensor:
        self._refuse(sliding_window, rel_bias)
        return self.context_step(ContextStep(q, PagedPool.of(pool, spec, k_scale, v_scale), block_tables,
                                             cu_seqlens_q, seq_lens, bool(causal), float(sm_scale),
                                             int(sliding_window or 0), rel_bias))

    def __repr__(self) -> str:
        """The expression that builds this backend again (a printed reproduction starts from it)."""
        cls = type(self)
        if cls.__module__.startswith("minikv.attention.backends."):
            return f"minikv.attention.backends.get({self.name!r})"
        return f"{cls.__module__}.{cls.__qualname__}()"


def quantize(x: torch.Tensor, fmt: int, layer_scale: float = 1.0):
    """(codes in the format's element dtype, fp32 per-row scales or None) of x [T, H, D], in plain torch."""
    table = formats.TABLE[fmt]
    if fmt in (formats.F16, formats.BF16, formats.F32):
        return x.to(table.code_dtype), None
    xf = x.to(torch.float32)
    if fmt == formats.FP8:
        return (xf / layer_scale).clamp(-formats.FP8_QMAX, formats.FP8_QMAX).to(torch.float8_e4m3fn), None
    scale = (xf.abs().amax(dim=-1) / table.qmax).clamp_min(formats.SCALE_EPS)
    y = xf / scale[..., None]
    if fmt == formats.INT8_PTH:
        return torch.round(y).clamp(-table.qmax, table.qmax).to(torch.int8), scale
    return y.clamp(-table.qmax, table.qmax).to(torch.float8_e4m3fn), scale


def sdpa_attend(q, k, v, causal: bool, sm_scale: float, window: int = 0, rel_bias=None):
    """torch SDPA of one request: q [n, Hq, D] over k/v [kv_len, Hkv, D] (query i at position kv_len - n + i)."""
    n, kv_len = q.shape[0], k.shape[0]
    i = torch.arange(n, device=q.device)[:, None] + (kv_len - n)
    j = torch.arange(kv_len, device=q.device)[None, :]
    bias = torch.zeros(q.shape[1], n, kv_len, dtype=torch.float32, device=q.device)
    if rel_bias is not None:
        bias = bias + rel_bias[:, (i - j).clamp(0, rel_bias.shape[1] - 1)]
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
        if window:
            bias = bias.masked_fill(j <= i - window, float("-inf"))
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=bias.to(q.dtype)[None], scale=sm_scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)

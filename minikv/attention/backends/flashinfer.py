"""FlashInfer's paged attention (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper) on CUDA.

FlashInfer reads a paged cache as separate K and V tensors [pages, page size, KV heads, head size] ("NHD"), with
any page stride: minikv's page views (PagedPool.k_pages / v_pages) for 16-bit "auto" and "fp8" (its k_scale and
v_scale passed to `run`). Block tables become indptr / indices / last_page_len; minikv's window W is
window_left = W - 1. Not covered: the per-token-head formats, T5's relative bias, float32.
"""
from __future__ import annotations

import torch

from minikv.attention.protocol import Adapter, ContextStep, DecodeStep, Features

from . import MissingBackendError

try:
    import flashinfer
except Exception as e:         # an ImportError, or a broken install raising something else
    raise MissingBackendError(f"the flashinfer backend needs FlashInfer: pip install flashinfer-python "
                              f"({type(e).__name__}: {e})") from e

WORKSPACE_BYTES = 128 * 2**20
_NO_PTH = "FlashInfer has no per-token-head scales (its fp8 cache takes one K and one V scale per layer)"


def page_lists(block_tables: torch.Tensor, seq_lens: torch.Tensor, page_size: int):
    """FlashInfer's (indptr, indices, last_page_len), int32 on the tables' device, from minikv's block tables."""
    lens = seq_lens.to(torch.int64)
    pages = -(-lens // page_size)
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=lens.device)
    indptr[1:] = torch.cumsum(pages, 0)
    named = torch.arange(block_tables.shape[1], device=lens.device)[None, :] < pages[:, None]
    indices = block_tables.to(torch.int64)[named]
    last = lens - (pages - 1) * page_size
    return indptr.to(torch.int32), indices.to(torch.int32), last.to(torch.int32)


class Backend(Adapter):
    name = "flashinfer"
    features = Features(formats=("auto", "fp8"), placements=("row",), dtypes=("bfloat16",),
                        head_sizes=(64, 128, 256), rel_bias=False, device="cuda",
                        notes={"formats": _NO_PTH, "rel_bias": "FlashInfer's wrappers take no additive score bias",
                               "head_sizes": "FlashInfer's prebuilt and JIT kernels take head sizes 64, 128 and 256",
                               "dtypes": "hunted in bfloat16 (FlashInfer computes in 16 bits)"})

    def __init__(self):
        self._workspace = None

    def _buffer(self, device) -> torch.Tensor:
        if self._workspace is None or self._workspace.device != device:
            self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspace

    def _kv(self, s):
        pool = s.pool
        kv_dtype = torch.float8_e4m3fn if pool.kv_cache_dtype == "fp8" else pool.element_dtype
        scales = {"k_scale": pool.k_scale, "v_scale": pool.v_scale} if pool.kv_cache_dtype == "fp8" else {}
        return (pool.k_pages.view(kv_dtype), pool.v_pages.view(kv_dtype)), kv_dtype, scales

    def decode_step(self, s: DecodeStep) -> torch.Tensor:
        cache, kv_dtype, scales = self._kv(s)
        indptr, indices, last = page_lists(s.block_tables, s.seq_lens, s.pool.block_size)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._buffer(s.q.device), "NHD",
                                                                use_tensor_cores=True)
        wrapper.plan(indptr, indices, last, s.q.shape[1], s.pool.spec.num_kv_heads, s.pool.spec.head_size,
                     s.pool.block_size, pos_encoding_mode="NONE", window_left=s.sliding_window - 1,
                     q_data_type=s.q.dtype, kv_data_type=kv_dtype, sm_scale=s.sm_scale)
        return wrapper.run(s.q.contiguous(), cache, **scales)

    def context_step(self, s: ContextStep) -> torch.Tensor:
        cache, kv_dtype, scales = self._kv(s)
        indptr, indices, last = page_lists(s.block_tables, s.seq_lens, s.pool.block_size)
        # FlashAttention-2's kernels: the "auto" choice may take FA3 on Hopper, whose prefill reads no fp8 pages
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._buffer(s.q.device), "NHD", backend="fa2")
        wrapper.plan(s.cu_seqlens_q.to(torch.int32), indptr, indices, last, s.q.shape[1],
                     s.pool.spec.num_kv_heads, s.pool.spec.head_size, s.pool.block_size, causal=s.causal,
                     pos_encoding_mode="NONE", window_left=s.sliding_window - 1 if s.causal else -1,
                     q_data_type=s.q.dtype, kv_data_type=kv_dtype, sm_scale=s.sm_scale)
        return wrapper.run(s.q.contiguous(), cache, **scales)

"""FlashInfer's paged decode timed on minikv's own pools: the peer of `python -m minikv.bench attention --peer flashinfer`.
See docs/internals.md#bench-flashinfer-peer."""
from __future__ import annotations

import torch

# minikv's format name -> the element type FlashInfer is told the cache holds
PEER_FORMATS = {"auto": torch.bfloat16, "fp8": torch.float8_e4m3fn}
VARIANTS = (("tensor cores", True), ("CUDA cores", False))
WORKSPACE_BYTES = 256 * 2**20


class FlashInferUnavailable(RuntimeError):
    """FlashInfer could not be imported: the message says how to provide it."""


def load():
    """The flashinfer module, or FlashInferUnavailable saying how to get it."""
    try:
        import flashinfer
    except Exception as e:      # an ImportError, or a broken install raising something else
        raise FlashInferUnavailable(
            f"--peer flashinfer needs the flashinfer-python package ({type(e).__name__}: {e}). Install it with "
            "`pip install flashinfer-python` where there is an index, or carry the archives tools/pack_flashinfer.sh "
            "writes in .whl/ (tools/gpu.sh unpacks them)") from e
    return flashinfer


def paged_view(pool: torch.Tensor, fmt: str, block_size: int, num_kv_heads: int, head_size: int) -> torch.Tensor:
    """minikv's pool of `fmt` as FlashInfer's NHD cache [pages, 2, page size, KV heads, head size] (no copy)."""
    if fmt not in PEER_FORMATS:
        raise ValueError(f"FlashInfer has no counterpart of the {fmt!r} cache format (it has {sorted(PEER_FORMATS)})")
    return pool.view(PEER_FORMATS[fmt]).view(pool.shape[0], 2, block_size, num_kv_heads, head_size)


class FlashInferDecode:
    """One workspace and the flashinfer module, reused by every case of a benchmark run."""

    def __init__(self):
        self.flashinfer = load()
        self.version = getattr(self.flashinfer, "__version__", "unknown")
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")

    def measure(self, layout, pool, tables, lens, q, sm_scale: float, minikv_out: torch.Tensor, time_fn) -> dict:
        """The faster variant's time on this case (`time_fn(fn)` -> Timing) and how far its output is from minikv's
        `minikv_out`; {} for a format FlashInfer does not have."""
        fmt = layout.kv_cache_dtype
        if fmt not in PEER_FORMATS:
            return {}
        batch, blocks_per_seq = tables.shape
        kv = paged_view(pool, fmt, layout.block_size, layout.num_kv_heads, layout.head_size)
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device) * blocks_per_seq
        indices = tables.reshape(-1).contiguous()
        last_page_len = ((lens - 1) % layout.block_size + 1).to(torch.int32)
        best = None
        for name, tensor_cores in VARIANTS:
            wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                         use_tensor_cores=tensor_cores)
            wrapper.plan(indptr, indices, last_page_len, q.shape[1], layout.num_kv_heads, layout.head_size,
                         layout.block_size, pos_encoding_mode="NONE", q_data_type=q.dtype,
                         kv_data_type=PEER_FORMATS[fmt], sm_scale=sm_scale)
            out = torch.empty_like(q)
            timing = time_fn(lambda w=wrapper, o=out: w.run(q, kv, out=o))
            diff = (out.float() - minikv_out.float()).abs().max().item()
            if best is None or timing.ms < best["flashinfer_ms"]:
                best = {"flashinfer_ms": timing.ms, "flashinfer_variant": name, "flashinfer_timing": timing.how,
                        "flashinfer_max_abs_diff": diff, **timing.columns("flashinfer_")}
        best["flashinfer"] = self.version
        return best


def warm(fmt: str, tensor_cores: bool) -> None:
    """Plan and run one small case of one variant, so that FlashInfer JIT-compiles it now (tools/gpu.sh runs the
    four variants' compiles side by side, one process each, before the benchmark needs them)."""
    flashinfer = load()
    dtype, batch, pages, heads, kv_heads, head_size, page = PEER_FORMATS[fmt], 2, 4, 32, 8, 128, 16
    kv = torch.zeros(batch * pages, 2, page, kv_heads, head_size, dtype=torch.bfloat16, device="cuda").to(dtype)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(WORKSPACE_BYTES, dtype=torch.uint8,
                                                                        device="cuda"), "NHD",
                                                            use_tensor_cores=tensor_cores)
    wrapper.plan(torch.arange(batch + 1, dtype=torch.int32, device="cuda") * pages,
                 torch.arange(batch * pages, dtype=torch.int32, device="cuda"),
                 torch.full((batch,), page, dtype=torch.int32, device="cuda"), heads, kv_heads, head_size, page,
                 pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=dtype)
    wrapper.run(torch.zeros(batch, heads, head_size, dtype=torch.bfloat16, device="cuda"), kv)
    torch.cuda.synchronize()


if __name__ == "__main__":
    import sys
    warm(sys.argv[1], sys.argv[2] == "tensor-cores")
    print(f"flashinfer {sys.argv[1]} {sys.argv[2]}: compiled")

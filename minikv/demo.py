"""The main job (`make run` / `minikv demo`): the kernels against their references per cache format, then both
tiny models generating through the engine."""
from __future__ import annotations

import torch

from minikv.cache.layout import KVLayout
from minikv.config import KV_CACHE_DTYPES


def kernel_roundtrip(kv_cache_dtype: str, device: torch.device, seed: int = 0) -> dict[str, float]:
    """Write random K/V into a paged pool (blocks in shuffled order), read them back through each kernel, and
    return the largest differences: kernel vs reference, and dequantized cache vs the original values."""
    from minikv import kernels as kern
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float16 if device.type == "cpu" else torch.bfloat16
    heads, kv_heads, head_size, block_size, seq_len, num_blocks = 4, 2, 32, 16, 40, 8
    layout = KVLayout(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    k = torch.randn(seq_len, kv_heads, head_size, generator=g).to(device, dtype)
    v = torch.randn(seq_len, kv_heads, head_size, generator=g).to(device, dtype)
    q = torch.randn(1, heads, head_size, generator=g).to(device, dtype)
    table = torch.randperm(num_blocks, generator=g)[: (seq_len + block_size - 1) // block_size]
    slots = (table.repeat_interleave(block_size)[:seq_len] * block_size
             + torch.arange(seq_len) % block_size).to(device)
    pool = torch.zeros(num_blocks, layout.block_bytes, dtype=torch.uint8, device=device)
    ref_pool = pool.clone()
    kern.write_kv(k, v, pool, slots, layout)
    kern.write_kv_reference(k, v, ref_pool, slots, layout)
    tables = table.to(device, torch.int32)[None]
    lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
    sm = head_size ** -0.5
    out = kern.paged_decode_attention(q, pool, tables, lens, layout, sm)
    ref = kern.paged_decode_attention_reference(q, pool, tables, lens, layout, sm)
    cu = torch.tensor([0, 1], dtype=torch.int32, device=device)
    ctx = kern.paged_context_attention(q[0:1], pool, tables, cu, lens, spec=layout, causal=True, sm_scale=sm)
    ctx_ref = kern.paged_context_attention_reference(q[0:1], pool, tables, cu, lens, spec=layout, causal=True,
                                                     sm_scale=sm)
    exact = kern.context_attention_reference(
        q[0:1], k, v, cu, torch.tensor([0, seq_len], dtype=torch.int32, device=device), causal=True, sm_scale=sm)
    return {
        "write: bytes differing from reference": float((pool != ref_pool).sum()),
        "decode: max |kernel - reference|": float((out - ref).abs().max()),
        "context: max |kernel - reference|": float((ctx - ctx_ref).abs().max()),
        "decode: max |quantized cache - exact|": float((out[0:1] - exact).abs().max()),
    }


def main(device: str | None = None) -> int:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"minikv demo on {device}")
    print("\n1. Kernels vs their PyTorch references, per KV cache format")
    for fmt in KV_CACHE_DTYPES:
        print(f"  {fmt}")
        for name, value in kernel_roundtrip(fmt, device).items():
            print(f"    {name:42s} {value:.3g}")

    import minikv
    print("\n2. Both tiny models, generating through the engine")
    for model, fmt in (("tiny-kvshare", "int8_per_token_head"), ("tiny-encdec", "fp8")):
        task = minikv.tasks.for_model(model)
        prompts = task.prompts(4, seed=0)
        llm = minikv.LLM(model=model, kv_cache_dtype=fmt, device=str(device), max_num_seqs=4)
        outs = llm.generate(prompts, [minikv.SamplingParams(max_tokens=task.max_tokens(p)) for p in prompts],
                            use_tqdm=False)
        print(f"  {model} (kv_cache_dtype={fmt})")
        for p, o in zip(prompts, outs):
            print(f"    {p!r} -> {o.text!r}  {'right' if task.check(p, o.text) else 'WRONG'}")
    return 0

"""Who reads a scale slot nobody wrote? The experiment behind "why is there a fill at all".
See docs/internals.md#repro-unwritten-slots."""
from __future__ import annotations

import torch

from minikv.cache.layout import KVLayout

FILLS = {"1.0 (the fill)": 1.0, "0.0 (zeroed)": 0.0, "NaN (garbage)": float("nan"), "inf (garbage)": float("inf")}


def _pool(layout: KVLayout, fill: float, written: int, seed: int = 0, device: str = "cpu"):
    from minikv import kernels
    g = torch.Generator().manual_seed(seed)
    pool = torch.zeros(2, layout.block_bytes, dtype=torch.uint8)
    k_codes, v_codes = layout.code_views(pool)
    k_codes.view(torch.uint8).copy_(torch.randint(0, 256, k_codes.shape, generator=g, dtype=torch.uint8))
    v_codes.view(torch.uint8).copy_(torch.randint(0, 256, v_codes.shape, generator=g, dtype=torch.uint8))
    ks, vs = layout.scale_views(pool)
    ks.fill_(fill)
    vs.fill_(fill)
    k = torch.randn(written, layout.num_kv_heads, layout.head_size, generator=g)
    v = torch.randn(written, layout.num_kv_heads, layout.head_size, generator=g)
    pool, k, v = pool.to(device), k.to(device), v.to(device)
    if written:
        kernels.write_kv_reference(k, v, pool, torch.arange(written, device=device), layout)
    return pool


def whole_block_reader(q, pool, layout: KVLayout, length: int, sm_scale: float) -> torch.Tensor:
    """Decode attention that dequantizes every slot of block 0 and masks only the scores (q [1, H, D])."""
    k_codes, v_codes = layout.code_views(pool)
    ks, vs = layout.scale_views(pool)
    k = k_codes[0].float() * ks[0][..., None]          # [block_size, Hkv, D]
    v = v_codes[0].float() * vs[0][..., None]
    group = q.shape[1] // layout.num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", q[0].float(), k) * sm_scale
    scores[:, length:] = float("-inf")
    p = scores.softmax(-1)                               # exactly 0 for the unwritten slots
    return torch.einsum("hn,nhd->hd", p, v)[None]


def run(backends=("torch", "triton"), device: str = "cpu") -> list[tuple[str, dict[str, str]]]:
    """[(reader, {fill: "same" | "NaN" | "differs"})], each output compared with the 1.0-fill output; on `device`
    (the Triton kernels run where minikv.kernels was imported for: the interpreter on CPU, compiled on CUDA)."""
    from minikv.attention.backend import get_ops
    layout = KVLayout("int8_per_token_head", torch.float32, 2, 16, 16)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 16, generator=g).to(device)
    sm = 16 ** -0.5
    table = torch.tensor([[0]], dtype=torch.int32, device=device)

    def i32(*values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    readers = {}
    for name in backends:
        ops = get_ops(name)
        readers[f"minikv decode ({name})"] = (5, lambda p, ops=ops: ops.decode(
            q, p, table, i32(5), layout, sm, validate=False))
        readers[f"minikv fused context ({name})"] = (5, lambda p, ops=ops: ops.paged_context(
            q, p, table, i32(0, 1), i32(5), layout,
            True, sm, validate=False))
    readers["whole-block reader (model)"] = (5, lambda p: whole_block_reader(q, p, layout, 5, sm))
    ops = get_ops("torch")
    readers["capture warmup's dummy decode (none written)"] = (0, lambda p: ops.decode(
        q, p, table, i32(1), layout, sm, validate=False))
    rows = []
    for reader, (written, fn) in readers.items():
        base = fn(_pool(layout, 1.0, written, device=device)).float()
        cells = {}
        for label, value in FILLS.items():
            out = fn(_pool(layout, value, written, device=device)).float()
            cells[label] = ("NaN" if bool(out.isnan().any()) else
                            "same" if torch.equal(out, base) else "differs")
        rows.append((reader, cells))
    return rows


def format_table(rows) -> str:
    head = f"{'reader (5 tokens written; other scale slots =)':48s} " + " ".join(f"{k:>15s}" for k in FILLS)
    lines = [head, "-" * len(head)]
    for reader, cells in rows:
        lines.append(f"{reader:48s} " + " ".join(f"{cells[k]:>15s}" for k in FILLS))
    return "\n".join(lines)

# One launch each, for Nsight Compute (tools/gpu_probes/ncu_attention.sh): minikv bf16 decode vs SDPA at batch 16 / context 512, causal paged context
import sys, torch
import torch.nn.functional as F
from minikv.bench import attention as a
from minikv.kernels.decode_attention import paged_decode_attention
from minikv.kernels.context_attention import paged_context_attention
from minikv.cache.layout import KVLayout
which = sys.argv[1]
if which == "decode":
    layout, pool, tables, lens, q, out = a.decode_problem("auto", 16, 512)
    for _ in range(3):
        paged_decode_attention(q, pool, tables, lens, spec=layout, sm_scale=a.D ** -0.5, out=out, validate=False)
    qs = torch.randn(16, a.HQ, 1, a.D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(16, a.HKV, 512, a.D, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
    for _ in range(3):
        F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)
else:
    B, L = 8, 4096
    q = torch.randn(B * L, a.HQ, a.D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(B * L, a.HKV, a.D, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
    layout = KVLayout("auto", torch.bfloat16, a.HKV, a.D, a.BS)
    pool, tables = a.paged_copy(k, v, layout, B, L)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device="cuda") * L
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    for _ in range(2):
        paged_context_attention(q, pool, tables, cu, lens, spec=layout, causal=True, sm_scale=a.D ** -0.5, validate=False)
    qs, ks, vs = (t.view(B, L, -1, a.D).transpose(1, 2) for t in (q, k, v))
    for _ in range(2):
        F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
torch.cuda.synchronize()
print("done", which)
